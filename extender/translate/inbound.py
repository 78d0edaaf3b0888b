"""Inbound: an extender request becomes what the core evaluates, once, at the boundary.

``ExtenderArgs`` -> the pod's ``PodIntent`` (``podspec.pod``) and its candidate names
(``extender_args``); names -> state rows, each node once (``candidates``); ``PodIntent`` ->
``scoring.PodRequest`` against the state's model ids (``pod_request``, the one place a
model name becomes an id and a mask); a request and the GPUs chosen -> the ``Allocation``
held (``allocation``). The cache calls each once per evaluation; nothing else converts.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from podspec.pods import PodIntent, item_name, pod_intent
from podspec.quantities import MAX_NAME_CHARS
from scoring.request import MILLI_PER_GPU, PodRequest, model_mask
from scoring.specs import Allocation
from scoring.state import ClusterState


def pod_request(intent: PodIntent, state: ClusterState) -> PodRequest:
    """Resolve a ``PodIntent`` against the state's model ids.

    A model name no node has resolves to no id, so every node fails the model check and
    the failure message names the models the pod asked for.
    """
    models = None if intent.gpu_models is None else state.model_ids(intent.gpu_models)
    return PodRequest(
        gpu_count=intent.gpu_count,
        gpu_milli=intent.gpu_milli if intent.gpu_count else MILLI_PER_GPU,
        gpu_memory_mib=intent.gpu_memory_mib,
        allowed_models=models,
        qos=intent.qos,
        cpu_milli=intent.cpu_milli,
        memory_mib=intent.memory_mib,
    )


def model_mask_of(intent: PodIntent, state: ClusterState) -> int:
    """The bitmask of the state's model ids the pod accepts (``scoring.request.model_mask``)."""
    return model_mask(None if intent.gpu_models is None else state.model_ids(intent.gpu_models))


def admission_memory_mib(intent: PodIntent) -> int:
    """The GPU memory a tenant quota counts before the GPUs are chosen: an explicit
    ``gpufrac.io/memory`` per GPU times the GPU count (a proportional request's memory
    depends on the GPU; bind checks the exact amount)."""
    return intent.gpu_count * (intent.gpu_memory_mib or 0)


def allocation(request: PodRequest, node: str, cols: tuple[int, ...], gpu_milli: int,
               gpu_memory_mib: tuple[int, ...]) -> Allocation:
    """The allocation of ``request`` on ``node``'s GPU columns ``cols`` (share ``gpu_milli``
    each, ``gpu_memory_mib`` per GPU), as bind and a claim hold it."""
    return Allocation(node, cols, gpu_milli if cols else 0, gpu_memory_mib, request.qos,
                      request.cpu_milli, request.memory_mib, model_mask(request.allowed_models),
                      gpu_memory_request_mib=request.gpu_memory_mib or 0)


def extender_args(pod: Mapping[str, Any], node_items: Sequence[Any] | None,
                  node_names: Sequence[str] | None) -> tuple[PodIntent, list[str]]:
    """The pod and candidate names of an ``ExtenderArgs`` (``filter``, ``prioritize``).

    The names come back as sent; ``candidates`` drops repeats where it looks the names up
    anyway (kube-scheduler never sends any, and a node must not get two answers).

    Parameters
    ----------
    pod : mapping
        ``ExtenderArgs.Pod``.
    node_items : sequence or None
        ``ExtenderArgs.Nodes.items`` (nodeCacheCapable false), else None.
    node_names : sequence of str or None
        ``ExtenderArgs.NodeNames`` (nodeCacheCapable true), else None.

    Raises
    ------
    ValueError
        When neither node form is given, or a Node is not an object with a name;
        ``PodSpecError`` for the pod.
    """
    if node_names is not None:
        names = list(node_names)
    elif node_items is not None:
        names = []
        for i, item in enumerate(node_items):
            name = item_name(item)
            if name is None:
                raise ValueError(f"Nodes.items[{i}].metadata.name: missing or not a name of at most "
                                 f"{MAX_NAME_CHARS} characters")
            names.append(name)
    else:
        raise ValueError("ExtenderArgs: one of NodeNames or Nodes is required")
    return pod_intent(pod, defrag_fields=False), names


@dataclass(slots=True)
class Candidates:
    """A candidate list resolved against one state (valid while the node set is unchanged).

    Attributes
    ----------
    names : list of str
        As sent (the key kube-scheduler's next call is compared with).
    rows : ndarray of int64, shape (n_known,)
        State rows of the known names, each once, in the order sent; read only (the
        incremental scorer recognizes the same list of every row by it).
    unknown : list of str
        Names not in the state, each once.
    known : list of str
        The names of ``rows``.
    """

    names: list[str]
    rows: NDArray[np.int64]
    unknown: list[str]
    known: list[str]
    pos: dict[str, int] | None = None
    known_array: NDArray[np.object_] | None = None

    def names_array(self) -> NDArray[np.object_]:
        """``known`` as an object array, built once per candidate list."""
        if self.known_array is None:
            self.known_array = np.asarray(self.known, dtype=object)
        return self.known_array

    def passed(self, fits: NDArray[np.bool_]) -> list[str]:
        """The known names where ``fits`` (what filter answers in ``NodeNames``)."""
        passed: list[str] = self.names_array()[fits].tolist()
        return passed

    def positions(self, names: Sequence[str]) -> NDArray[np.int64] | None:
        """Positions of ``names`` in ``known``, each once; None if any is not there or repeats."""
        if self.pos is None:
            self.pos = {n: i for i, n in enumerate(self.known)}
        out = np.fromiter(map(self.pos.get, names, itertools.repeat(-1)), dtype=np.int64, count=len(names))
        return out if (out >= 0).all() and not has_repeats(out, len(self.known)) else None


def candidates(state: ClusterState, names: Sequence[str]) -> Candidates:
    """Resolve candidate names against ``state``: rows of the known ones, each node once.

    The one lookup of a request's names: a name sent twice is answered once (its first
    place); the common case (no repeats) costs one dictionary lookup per name.
    """
    sent = list(names)
    rows, unknown = rows_for_names(state, sent)
    if has_repeats(rows, state.n_nodes) or len(set(unknown)) != len(unknown):
        names = list(dict.fromkeys(sent))
        rows, unknown = rows_for_names(state, names)
    known = list(names) if not unknown else [state.node_names[r] for r in rows.tolist()]
    rows.flags.writeable = False
    return Candidates(sent, rows, unknown, known)


def has_repeats(rows: NDArray[np.int64], n_rows: int) -> bool:
    """Whether a row appears twice in ``rows`` (values in ``[0, n_rows)``)."""
    return rows.size > 1 and int(np.bincount(rows, minlength=n_rows).max()) > 1


def rows_for_names(state: ClusterState, names: Sequence[str]) -> tuple[NDArray[np.int64], list[str]]:
    """State rows of the known names (in the given order) and the unknown names."""
    rows = np.fromiter(map(state.node_index.get, names, itertools.repeat(-1)), dtype=np.int64, count=len(names))
    missing = rows < 0
    if not missing.any():
        return rows, []
    return rows[~missing], [names[i] for i in np.flatnonzero(missing).tolist()]
