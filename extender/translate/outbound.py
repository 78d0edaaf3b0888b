"""Outbound: what the core decided becomes kube-scheduler's JSON, built once.

Float scores -> 0..``MAX_EXTENDER_PRIORITY`` wire integers; ``scoring.fit.Reason`` codes ->
the messages kube-scheduler shows in FailedScheduling events, split into the passed, failed
and unresolvable candidates (the verbs in ``extender.verbs`` build the bodies).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from podspec import annotations as ann
from podspec.pods import PodIntent
from podspec.quantities import quote
from scoring.evaluated import Evaluation
from scoring.fit import Reason
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler ``extender/v1.MaxExtenderPriority``: the highest score an extender returns."""

UNRESOLVABLE = np.array([Reason.TOO_FEW_GPUS, Reason.GPU_MODEL_MISMATCH, Reason.GPU_UNHEALTHY])
"""Reasons preemption cannot fix: kube-scheduler gets them in ``FailedAndUnresolvableNodes``."""

MEMORY_ABOVE_EVERY_GPU = len(Reason)
"""A message code beside ``Reason``'s: the pod's ``gpufrac.io/memory`` exceeds every GPU of the
node (reported in place of the QoS isolation, share, memory or slot check that failed first:
every ``Reason`` from ``INSUFFICIENT_GPU_SHARE`` on)."""

_UNRESOLVABLE_CODE = np.zeros(len(Reason) + 1, dtype=bool)
_UNRESOLVABLE_CODE[UNRESOLVABLE] = True
_UNRESOLVABLE_CODE[MEMORY_ABOVE_EVERY_GPU] = True
_UNRESOLVABLE_CODE.flags.writeable = False
"""By message code: whether it goes to ``FailedAndUnresolvableNodes``."""

NODE_UNKNOWN_MESSAGE = "gpufrac: node not in gpufrac's cache (no inventory seen for it)"


def filter_result(evaluation: Evaluation, intent: PodIntent, names: Sequence[str] | np.ndarray,
                  pieces: int = 0) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Split candidates into passed, ``FailedNodes`` and ``FailedAndUnresolvableNodes``.

    A message depends only on the reason and the pod, never on the node: kube-scheduler
    groups identical reasons into its FailedScheduling event ("0/1213 nodes are available:
    900 gpufrac: insufficient GPU share ..."), which per-node numbers would splinter into
    hundreds of lines. Reasons preemption cannot fix (``UNRESOLVABLE``, and a
    ``gpufrac.io/memory`` larger than every GPU of the node) go to the second map.

    Parameters
    ----------
    evaluation : Evaluation
    intent : PodIntent
        The pod, for the model names it asked for.
    names : sequence of str, or ndarray of shape (m,), object
        Candidate names aligned with the evaluation's rows (the cache's object array of them
        saves building one per call).
    pieces : int
        When no candidate fits and the pod's request is free in sum on them, the nodes holding
        pieces of it (``CandidateEvaluation.pieces``): the share reasons say so, since room
        that is there in pieces is fragmentation, not capacity.

    Returns
    -------
    passed : list of str
    failed, unresolvable : dict of str to str
    """
    ev = evaluation
    out = np.flatnonzero(~ev.node_fits)
    if out.shape[0] == 0:  # every candidate fits: no message to build
        return (names.tolist() if isinstance(names, np.ndarray) else list(names)), {}, {}
    arr = names if isinstance(names, np.ndarray) else np.asarray(names, dtype=object)
    codes = ev.reason[out].astype(np.int64)
    if ev.request.gpu_memory_mib is not None:
        # The binding constraint first: GPU memory no GPU of the node has fails the pod there
        # whatever the share, so say that rather than the share check that ran before it.
        larger = ev.request.gpu_memory_mib > ev.gpu_mem_max_mib[out]
        codes = np.where(larger & (codes >= Reason.INSUFFICIENT_GPU_SHARE), MEMORY_ABOVE_EVERY_GPU, codes)
    table = np.empty(len(Reason) + 1, dtype=object)  # messages of the reasons present only
    for code in np.unique(codes).tolist():
        table[code] = (reason_message(Reason(code), ev.request, intent) if code != MEMORY_ABOVE_EVERY_GPU else
                       f"gpufrac: insufficient GPU memory: pod needs {ev.request.gpu_memory_mib}Mi "
                       f"({ann.MEMORY}) on one GPU, more than any GPU of the node has")
    if pieces and table[Reason.INSUFFICIENT_GPU_SHARE] is not None:
        table[Reason.INSUFFICIENT_GPU_SHARE] += (f"; the {ev.request.gpu_count * ev.request.gpu_milli} milli-GPU "
                                                 f"it asks is free in pieces on {pieces} nodes: fragmentation")
    # More memory than any GPU of the node has: no preemption can make room there.
    unres = _UNRESOLVABLE_CODE[codes]
    failed = arr[out]
    return (
        arr[ev.node_fits].tolist(),
        dict(zip(failed[~unres].tolist(), table[codes[~unres]].tolist(), strict=True)),
        dict(zip(failed[unres].tolist(), table[codes[unres]].tolist(), strict=True)),
    )


def reason_message(reason: Reason, request: PodRequest, intent: PodIntent) -> str:
    """The user-facing text of one ``Reason`` for one pod."""
    k, milli = request.gpu_count, request.gpu_milli
    share = "a whole unshared GPU" if milli == MILLI_PER_GPU else f"{milli} milli-GPU free on one GPU"
    per_gpu = f"{k} GPU(s) with {share}" if k > 1 else share
    messages = {
        Reason.FITS: "fits",
        Reason.NODE_NOT_READY: (f"inventory stale: no fresh, valid {ann.INVENTORY} from the node's "
                                "gpufrac agent"),
        Reason.INSUFFICIENT_CPU: f"insufficient cpu (pod requests {request.cpu_milli}m)",
        Reason.INSUFFICIENT_MEMORY: f"insufficient memory (pod requests {request.memory_mib}Mi)",
        Reason.TOO_FEW_GPUS: f"node has fewer than {k} GPUs",
        Reason.GPU_MODEL_MISMATCH: (
            f"{ann.GPU_MODEL} {quote('|'.join(sorted(intent.gpu_models or ())))}: "
            f"fewer than {k} GPU(s) of an allowed model on node"),
        Reason.GPU_UNHEALTHY: f"fewer than {k} healthy GPU(s) of an allowed model",
        Reason.INSUFFICIENT_GPU_SHARE: f"insufficient GPU share: pod needs {per_gpu}",
        Reason.INSUFFICIENT_GPU_MEMORY: (
            "insufficient GPU memory: pod needs "
            + (f"{request.gpu_memory_mib}Mi" if request.gpu_memory_mib is not None
               else f"{milli / MILLI_PER_GPU:g} of the GPU's memory")
            + " on a GPU with enough share"),
        Reason.NO_REPLICA_SLOT: "no free time-slicing replica slot on the GPUs that fit",
        Reason.QOS_ISOLATION: (
            f"QoS isolation: a {request.qos.wire_name} pod does not share a GPU with "
            f"{'best-effort' if request.qos == QoSClass.GUARANTEED else 'guaranteed'} pods"),
    }
    return "gpufrac: " + messages[reason]


def wire_scores(evaluation: Evaluation) -> list[int]:
    """Map float node scores to kube-scheduler's 0..``MAX_EXTENDER_PRIORITY`` integers.

    The best node (``Evaluation.best``: highest score, lowest cluster row on ties) alone gets
    10, so kube-scheduler's random tie-break among its top total never overrides gpufrac's
    choice. The other feasible nodes get ``1 + floor(8 * (s - s_min) / (s_max - s_min))``
    (9 when all scores are equal): ranking kept, near-ties stay near, and 0 is left for
    infeasible nodes.

    Returns
    -------
    list of int
        One per candidate, in candidate order.
    """
    fits = evaluation.node_fits
    out = np.zeros(fits.shape[0], dtype=np.int64)
    best = evaluation.best()
    if best < 0:
        return out.tolist()
    s = evaluation.score[fits]
    lo, hi = float(s.min()), float(s.max())
    top = MAX_EXTENDER_PRIORITY - 1
    if hi > lo:
        scaled = 1 + np.floor((top - 1) * (evaluation.score - lo) / (hi - lo)).astype(np.int64)
    else:
        scaled = np.full(fits.shape[0], top, dtype=np.int64)
    out = np.where(fits, np.clip(scaled, 1, top), 0)
    out[best] = MAX_EXTENDER_PRIORITY
    return out.tolist()
