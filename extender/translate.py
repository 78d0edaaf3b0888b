"""The only bridge between Kubernetes JSON (wire bodies, Pods, Nodes) and the numpy core.

Inbound: Pod JSON -> ``PodIntent`` -> ``scoring.PodRequest``; node names (``NodeNames`` or
``Nodes`` objects) -> state rows. Outbound: float scores -> 0..10 wire
integers; ``scoring.fit.Reason`` codes -> the messages kube-scheduler shows in
FailedScheduling events.

Every parse error is a ``PodSpecError`` / ``ValueError`` whose message names the field, the
offending value (quoted, truncated) and the rule.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
from kubernetes.utils.quantity import parse_quantity
from numpy.typing import NDArray

from extender import annotations as ann
from scoring.fit import Reason
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass
from scoring.state import ClusterState, GpuSpec, NodeSpec
from scoring.strategies import Evaluation

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler ``extender/v1.MaxExtenderPriority``: the highest score an extender returns."""

MIB = 1024 * 1024
_QOS_BY_NAME = {q.wire_name: q for q in QoSClass}


class PodSpecError(ValueError):
    """A pod's resources or gpufrac annotations are invalid; the message is user-facing."""


def quote(value: object, limit: int = 64) -> str:
    """JSON-quote a user-provided value for messages and logs, truncated to ``limit`` chars."""
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return json.dumps(text)


@dataclass(frozen=True, slots=True)
class PodIntent:
    """A pod as gpufrac needs it, with model names not yet resolved to ids.

    Attributes
    ----------
    uid, namespace, name : str
    node_name : str
        ``spec.nodeName``; ``""`` while pending.
    phase : str
        ``status.phase`` (``Pending``, ``Running``, ``Succeeded``, ``Failed``...).
    gpu_count : int
        Sum of ``gpufrac.io/gpu`` over the containers.
    gpu_milli : int
        Share per GPU, milli-GPU.
    gpu_memory_mib : int or None
        ``gpufrac.io/memory`` in MiB (rounded up), ``None`` when absent.
    gpu_models : frozenset of str or None
    qos : QoSClass
    cpu_milli, memory_mib : int
        Effective pod requests (max of the init containers and the sum of the containers).
    assigned_gpus : tuple of str
        UUIDs from ``gpufrac.io/assigned-gpus`` (set by gpufrac at bind).
    assigned_gpu_milli : int or None
        ``gpufrac.io/assigned-fraction`` in milli-GPU, None when absent or unreadable.
    assigned_memory_mib : tuple of int
        ``gpufrac.io/assigned-memory``, MiB per assigned GPU; empty when absent, unreadable
        or not one per assigned GPU.
    scheduler_name : str
        ``spec.schedulerName``.
    priority : int
        ``spec.priority`` (resolved from the PriorityClass at admission), 0 when absent.
    """

    uid: str
    namespace: str
    name: str
    node_name: str
    phase: str
    gpu_count: int
    gpu_milli: int
    gpu_memory_mib: int | None
    gpu_models: frozenset[str] | None
    qos: QoSClass
    cpu_milli: int
    memory_mib: int
    assigned_gpus: tuple[str, ...] = ()
    assigned_gpu_milli: int | None = None
    assigned_memory_mib: tuple[int, ...] = ()
    scheduler_name: str = ""
    priority: int = 0

    @property
    def key(self) -> str:
        """``namespace/name`` for messages."""
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        """True once the pod can no longer use its allocation."""
        return self.phase in ("Succeeded", "Failed")


# -- bounds --------------------------------------------------------------------------------
# Every quantity from a pod, node or request body is checked against one of these before it
# becomes a number the core sees, so nothing a user writes can size an array, overflow
# int64 or underflow to zero. Each is far beyond any real machine.

MAX_GPUS_PER_POD = ann.MAX_GPUS_PER_NODE
"""Most GPUs a pod may ask for: the most a node's inventory may list (``NodeInventory.gpus``)."""
MAX_CPU_MILLI = 10**9
"""Largest CPU request or allocatable, milli-cores (a million cores)."""
MAX_MEMORY_MIB = 2**40
"""Largest host memory request or allocatable, MiB (an exbibyte)."""
MAX_GPU_MEMORY_MIB = ann.MAX_GPU_MEMORY_MIB
"""Largest GPU memory per GPU a pod may ask for, MiB (16 TiB)."""
_MAX_CORES = Decimal(MAX_CPU_MILLI) / 1000
_MAX_MEMORY_BYTES = Decimal(MAX_MEMORY_MIB) * MIB
_MAX_GPU_MEMORY_BYTES = Decimal(MAX_GPU_MEMORY_MIB) * MIB
INT32 = (-(2**31), 2**31 - 1)
"""Range of ``spec.priority`` (Go ``*int32``)."""
MAX_NAME_CHARS = 253
MAX_MODELS = 64

_QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3}|[KMGTPE]i|[numkMGTPE])?", re.ASCII)
"""Kubernetes' quantity grammar (``resource.ParseQuantity``), ASCII digits only, exponents of
at most three digits (``1e-1000030`` would underflow to 0 and ``1e999999`` overflow)."""
_FRACTION = re.compile(r"(?:[0-9]{1,4}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})", re.ASCII)


def _text(value: object, field: str, limit: int = MAX_NAME_CHARS) -> str:
    """A string field of user input: must be a string of at most ``limit`` characters."""
    if not isinstance(value, str):
        raise PodSpecError(f"{field}: {quote(value)} must be a string")
    if len(value) > limit:
        raise PodSpecError(f"{field}: {quote(value)} is longer than {limit} characters")
    return value


def _quantity(value: object, field: str, *, maximum: Decimal | int, unit: str = "",
              positive: bool = False) -> Decimal:
    """A Kubernetes quantity in ``[0, maximum]`` (``(0, maximum]`` with ``positive``).

    Accepts a string in Kubernetes' quantity grammar (ASCII digits, SI or binary suffix) or a
    JSON number written in that grammar; never a boolean, a list or an object.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PodSpecError(f"{field}: {quote(value)} must be a quantity string, e.g. \"8Gi\", \"500m\", \"2\"")
    text = value.strip() if isinstance(value, str) else repr(value)
    if len(text) > 64 or not _QUANTITY.fullmatch(text):
        raise PodSpecError(
            f"{field}: {quote(value)} is not a Kubernetes quantity (e.g. \"8Gi\", \"500Mi\", \"2\")")
    try:
        q = Decimal(parse_quantity(text))
    except (ValueError, TypeError, ArithmeticError):
        raise PodSpecError(f"{field}: {quote(value)} is not a Kubernetes quantity") from None
    if q < 0 or (positive and q == 0):
        raise PodSpecError(f"{field}: {quote(value)} must be {'> 0' if positive else '>= 0'}")
    if q > maximum:
        raise PodSpecError(f"{field}: {quote(value)} is too large (at most {maximum}{unit})")
    return q


def _container_requests(container: Mapping[str, Any], where: str) -> tuple[int, int, int]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise PodSpecError(f"{where}.resources: must be an object")
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        raise PodSpecError(f"{where}.resources: limits and requests must be objects")
    gpus = 0
    raw_gpu = limits.get(ann.RESOURCE_GPU, requests.get(ann.RESOURCE_GPU))
    if raw_gpu is not None:
        field = f"{where}.resources.limits[{ann.RESOURCE_GPU}]"
        q = _quantity(raw_gpu, field, maximum=MAX_GPUS_PER_POD, unit=" GPUs")
        if q != q.to_integral_value():
            raise PodSpecError(
                f"{field}: {quote(raw_gpu)} must be a whole number of GPUs >= 0 (use the "
                "gpufrac.io/fraction annotation for a share)")
        gpus = int(q)
    # kube-scheduler falls back to limits when a request is absent.
    cpu = requests.get("cpu", limits.get("cpu"))
    mem = requests.get("memory", limits.get("memory"))
    cpu_milli = mem_mib = 0
    if cpu is not None and cpu != "":
        q = _quantity(cpu, f"{where}.resources.requests.cpu", maximum=_MAX_CORES,
                      unit=" cores")
        cpu_milli = math.ceil(q * 1000)
    if mem is not None and mem != "":
        q = _quantity(mem, f"{where}.resources.requests.memory", maximum=_MAX_MEMORY_BYTES,
                      unit=" bytes")
        mem_mib = math.ceil(q / MIB)
    return gpus, cpu_milli, mem_mib


def _fraction_milli(raw: object, field: str = ann.FRACTION) -> int:
    """``gpufrac.io/fraction``: a decimal in [0.001, 1], in milli-GPU (never 0)."""
    rule = "must be a decimal in [0.001, 1] with at most 3 decimal places, e.g. \"0.25\""
    if not isinstance(raw, str):
        raise PodSpecError(f"{field}: {quote(raw)} must be a string; {rule}")
    text = raw.strip()
    if not _FRACTION.fullmatch(text):
        raise PodSpecError(f"{field}: {quote(raw)} is not a plain decimal number; {rule}")
    value = Decimal(text)
    if not 0 < value <= 1:
        raise PodSpecError(f"{field}: {quote(raw)} is out of range; {rule}")
    milli = value * MILLI_PER_GPU
    if milli != milli.to_integral_value():
        raise PodSpecError(f"{field}: {quote(raw)} is finer than 1/1000 GPU; {rule}")
    return int(milli)


def pod_intent(pod: Mapping[str, Any]) -> PodIntent:
    """Parse a Pod object (API JSON, as in ``ExtenderArgs.Pod`` or a watch event).

    Every quantity is bounded here (``MAX_GPUS_PER_POD``, ``MAX_CPU_MILLI``,
    ``MAX_MEMORY_MIB``, ``MAX_GPU_MEMORY_MIB``, int32 priority), so a ``PodIntent`` always
    makes a valid ``scoring.PodRequest`` and nothing in it can size an array past the
    cluster's own dimensions.

    Parameters
    ----------
    pod : mapping
        The Pod JSON.

    Returns
    -------
    PodIntent

    Raises
    ------
    PodSpecError
        On a malformed Pod or an invalid gpufrac annotation or resource; the message names
        the field, the value and the rule.
    """
    if not isinstance(pod, Mapping):
        raise PodSpecError("Pod: must be an object")
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise PodSpecError("Pod: metadata, spec and status must be objects")
    name = _text(meta.get("name"), "Pod.metadata.name")
    if not name:
        raise PodSpecError("Pod.metadata.name: missing")
    namespace = _text(meta.get("namespace") or "default", "Pod.metadata.namespace", 63)
    uid = _text(meta.get("uid") or "", "Pod.metadata.uid", 128)
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise PodSpecError("Pod.metadata.annotations: must be an object")

    def containers(key: str) -> list[tuple[int, int, int]]:
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            raise PodSpecError(f"Pod.spec.{key}: must be a list of objects")
        return [_container_requests(c, f"{key}[{quote(c.get('name', i), 63)[1:-1]}]")
                for i, c in enumerate(items)]

    main = containers("containers")
    init = containers("initContainers")
    # Effective request = max(sum over containers, max over init containers), as kubelet.
    eff = [max(sum(c[i] for c in main), max((c[i] for c in init), default=0)) for i in range(3)]
    gpu_count, cpu_milli, memory_mib = eff
    for total, bound, what in ((gpu_count, MAX_GPUS_PER_POD, f"{ann.RESOURCE_GPU} (all containers)"),
                               (cpu_milli, MAX_CPU_MILLI, "cpu requests (all containers), milli-cores"),
                               (memory_mib, MAX_MEMORY_MIB, "memory requests (all containers), MiB")):
        if total > bound:
            raise PodSpecError(f"Pod.spec: {what} add up to {total}, more than {bound}")

    milli = MILLI_PER_GPU
    if ann.FRACTION in annotations:
        milli = _fraction_milli(annotations[ann.FRACTION])
        if milli < MILLI_PER_GPU and gpu_count > 1:
            raise PodSpecError(
                f"{ann.FRACTION}: {quote(annotations[ann.FRACTION])} is below 1 but the pod asks for "
                f"{gpu_count} GPUs ({ann.RESOURCE_GPU}); a share below 1 needs exactly 1 GPU"
            )
    gpu_mem: int | None = None
    if ann.MEMORY in annotations:
        raw = annotations[ann.MEMORY]
        q = _quantity(_text(raw, ann.MEMORY, 64), ann.MEMORY, maximum=_MAX_GPU_MEMORY_BYTES,
                      unit=" bytes", positive=True)
        gpu_mem = math.ceil(q / MIB)
    models: frozenset[str] | None = None
    if ann.GPU_MODEL in annotations:
        raw = _text(annotations[ann.GPU_MODEL], ann.GPU_MODEL, MAX_MODELS * 65)
        parts = [p.strip() for p in raw.split("|")]
        if not all(parts) or len(parts) > MAX_MODELS or any(len(p) > 64 for p in parts):
            raise PodSpecError(
                f"{ann.GPU_MODEL}: {quote(raw)} must be 1 to {MAX_MODELS} model names of 1 to 64 "
                "characters separated by '|', e.g. \"T4|V100M32\""
            )
        models = frozenset(parts)
    qos = QoSClass.BURSTABLE
    if ann.QOS in annotations:
        raw = annotations[ann.QOS]
        if not isinstance(raw, str) or raw not in _QOS_BY_NAME:
            raise PodSpecError(
                f"{ann.QOS}: {quote(raw)} is not a QoS class; use one of "
                f"{', '.join(q.wire_name for q in QoSClass)}"
            )
        qos = _QOS_BY_NAME[raw]
    priority = spec.get("priority") or 0
    if isinstance(priority, bool) or not isinstance(priority, int) or not INT32[0] <= priority <= INT32[1]:
        raise PodSpecError(f"Pod.spec.priority: {quote(priority)} must be an int32 integer")
    raw_assigned = annotations.get(ann.ASSIGNED_GPUS, "")
    assigned = tuple(u for u in raw_assigned.split(",") if u) if isinstance(raw_assigned, str) else ()
    if len(assigned) > MAX_GPUS_PER_POD or any(len(u) > 128 for u in assigned):
        assigned = ()  # not a record gpufrac could have written: counts as none
    assigned_milli, assigned_mem = _assigned_share(annotations, len(assigned))
    return PodIntent(
        uid=uid,
        namespace=namespace,
        name=name,
        node_name=_text(spec.get("nodeName") or "", "Pod.spec.nodeName"),
        phase=_text(status.get("phase") or "Pending", "Pod.status.phase", 32),
        gpu_count=gpu_count,
        gpu_milli=milli,
        gpu_memory_mib=gpu_mem,
        gpu_models=models,
        qos=qos,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        assigned_gpus=assigned,
        assigned_gpu_milli=assigned_milli,
        assigned_memory_mib=assigned_mem,
        scheduler_name=_text(spec.get("schedulerName") or "", "Pod.spec.schedulerName"),
        priority=priority,
    )


def _assigned_share(annotations: Mapping[str, Any], n_gpus: int) -> tuple[int | None, tuple[int, ...]]:
    """Read back the share and memory gpufrac wrote at bind; lenient (None/() if unreadable).

    These annotations are gpufrac's own record, not user input: if someone edited them into
    nonsense the pod's request is used instead, and the allocation stays accounted.
    """
    milli: int | None = None
    try:
        milli = _fraction_milli(annotations[ann.ASSIGNED_FRACTION], ann.ASSIGNED_FRACTION)
    except (KeyError, PodSpecError):
        pass
    mem: tuple[int, ...] = ()
    raw = annotations.get(ann.ASSIGNED_MEMORY)
    if raw and isinstance(raw, str):
        try:
            values = tuple(math.ceil(_quantity(v, ann.ASSIGNED_MEMORY, positive=True,
                                               maximum=_MAX_GPU_MEMORY_BYTES) / MIB)
                           for v in raw.split(",")[:MAX_GPUS_PER_POD + 1])
        except PodSpecError:
            values = ()
        if len(values) == n_gpus and all(v > 0 for v in values):
            mem = values
    return milli, mem


def allocation_annotations(gpu_uuids: Sequence[str], gpu_milli: int,
                           gpu_memory_mib: Sequence[int], at: datetime) -> dict[str, str]:
    """The pod annotations gpufrac writes at bind: its allocation record.

    Parameters
    ----------
    gpu_uuids : sequence of str
        NVML UUIDs of the chosen GPUs (empty for a pod without GPUs).
    gpu_milli : int
        Share per GPU, milli-GPU.
    gpu_memory_mib : sequence of int
        GPU memory per chosen GPU, MiB.
    at : datetime
        Bind time (timezone-aware).

    Returns
    -------
    dict of str to str
        ``gpufrac.io/assigned-gpus`` (``,``-separated UUIDs), ``assigned-fraction`` (decimal,
        e.g. ``0.25``), ``assigned-memory`` (``,``-separated quantities, e.g. ``4096Mi``),
        ``assigned-at`` (RFC 3339, UTC).
    """
    return {
        ann.ASSIGNED_GPUS: ",".join(gpu_uuids),
        ann.ASSIGNED_FRACTION: str(Decimal(gpu_milli) / MILLI_PER_GPU),
        ann.ASSIGNED_MEMORY: ",".join(f"{m}Mi" for m in gpu_memory_mib),
        ann.ASSIGNED_AT: at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }


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


def _item_name(item: Any) -> str | None:
    """``metadata.name`` of a Node item of any shape; None when it has none."""
    meta = item.get("metadata") if isinstance(item, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name and len(name) <= MAX_NAME_CHARS else None


def extender_args(pod: Mapping[str, Any], node_items: Sequence[Any] | None,
                  node_names: Sequence[str] | None) -> tuple[PodIntent, list[str]]:
    """The pod and candidate names of an ``ExtenderArgs`` (``filter``, ``prioritize``).

    A name listed twice is kept once (its first place): kube-scheduler never sends
    duplicates, and a node must not get two answers.

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
        names = list(dict.fromkeys(node_names))
    elif node_items is not None:
        names = []
        for i, item in enumerate(node_items):
            name = _item_name(item)
            if name is None:
                raise ValueError(f"Nodes.items[{i}].metadata.name: missing or not a name of at most "
                                 f"{MAX_NAME_CHARS} characters")
            names.append(name)
        names = list(dict.fromkeys(names))
    else:
        raise ValueError("ExtenderArgs: one of NodeNames or Nodes is required")
    return pod_intent(pod), names


def rows_for_names(state: ClusterState, names: Sequence[str]) -> tuple[NDArray[np.int64], list[str]]:
    """State rows of the known names (in the given order) and the unknown names."""
    get = state.node_index.get
    rows = np.fromiter((get(n, -1) for n in names), dtype=np.int64, count=len(names))
    missing = rows < 0
    if not missing.any():
        return rows, []
    return rows[~missing], [names[i] for i in np.flatnonzero(missing).tolist()]


@dataclass(frozen=True, slots=True)
class NodeObservation:
    """A Node object as gpufrac needs it, before the heartbeat is judged.

    Attributes
    ----------
    name : str
    cpu_milli, memory_mib : int
        ``status.allocatable`` cpu (milli-cores) and memory (MiB).
    gpus : tuple of GpuSpec
        From the ``gpufrac.io/inventory`` annotation, in index order; empty when absent or
        invalid.
    heartbeat : datetime or None
        The inventory's heartbeat (timezone-aware); None when absent or invalid.
    problem : str
        Why the inventory is unusable (``""`` when it is fine), for logs.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...]
    heartbeat: datetime | None
    problem: str = ""

    def spec(self, now: datetime, stale_after_s: float) -> NodeSpec:
        """The node for the core: ready only with a valid inventory at most ``stale_after_s`` old."""
        fresh = (self.heartbeat is not None and not self.problem
                 and (now - self.heartbeat).total_seconds() <= stale_after_s)
        return NodeSpec(self.name, self.cpu_milli, self.memory_mib, self.gpus, ready=fresh)


def node_observation(node: Mapping[str, Any]) -> NodeObservation:
    """Parse a Node object (API JSON, from the node watch).

    CPU and memory come from ``status.allocatable``; the GPUs from the ``gpufrac.io/inventory``
    annotation. An invalid inventory does not raise: the node keeps its CPU and memory (CPU-only
    pods still count there) and gets no usable GPUs, with the reason in ``problem``.

    Raises
    ------
    ValueError
        When the Node has no name.
    """
    name = _item_name(node)
    if name is None:
        raise ValueError("Node.metadata.name: missing")
    meta = node["metadata"]
    status = node.get("status")
    alloc = (status.get("allocatable") if isinstance(status, Mapping) else None) or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(alloc, Mapping) or not isinstance(annotations, Mapping):
        return NodeObservation(name, 0, 0, (), None, "status.allocatable and metadata.annotations: must be objects")
    try:
        cpu_milli = math.floor(_quantity(alloc.get("cpu", "0"), "cpu",
                                         maximum=_MAX_CORES, unit=" cores") * 1000)
        memory_mib = math.floor(_quantity(alloc.get("memory", "0"), "memory",
                                          maximum=_MAX_MEMORY_BYTES, unit=" bytes") / MIB)
    except PodSpecError as exc:
        return NodeObservation(name, 0, 0, (), None, f"status.allocatable.{exc}")
    raw = annotations.get(ann.INVENTORY)
    if raw is None:
        return NodeObservation(name, cpu_milli, memory_mib, (), None, f"no {ann.INVENTORY} annotation")
    if not isinstance(raw, str):
        return NodeObservation(name, cpu_milli, memory_mib, (), None, f"{ann.INVENTORY}: must be a string")
    try:
        inv = ann.parse_inventory(raw)
    except ValueError as exc:
        return NodeObservation(name, cpu_milli, memory_mib, (), None, str(exc))
    if inv.node != name:
        return NodeObservation(name, cpu_milli, memory_mib, (), None,
                               f"{ann.INVENTORY}: published for node {quote(inv.node)}")
    gpus = tuple(GpuSpec(g.index, g.uuid, g.model, g.memory_mib, g.replicas, g.healthy,
                         g.memory_used_mib)
                 for g in sorted(inv.gpus, key=lambda g: g.index))
    heartbeat = inv.heartbeat if inv.heartbeat.tzinfo else inv.heartbeat.replace(tzinfo=UTC)
    return NodeObservation(name, cpu_milli, memory_mib, gpus, heartbeat)


UNRESOLVABLE = np.array([Reason.TOO_FEW_GPUS, Reason.GPU_MODEL_MISMATCH, Reason.GPU_UNHEALTHY])
"""Reasons preemption cannot fix: kube-scheduler gets them in ``FailedAndUnresolvableNodes``."""

NODE_UNKNOWN_MESSAGE = "gpufrac: node not in gpufrac's cache (no inventory seen for it)"


def filter_result(evaluation: Evaluation, intent: PodIntent,
                  names: Sequence[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
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
    names : sequence of str
        Candidate names aligned with the evaluation's rows.

    Returns
    -------
    passed : list of str
    failed, unresolvable : dict of str to str
    """
    ctx = evaluation.context
    codes = ctx.reason.astype(np.int64)
    table = np.array([reason_message(r, ctx.request, intent) for r in Reason], dtype=object)
    arr = np.asarray(names, dtype=object)
    unres = np.isin(codes, UNRESOLVABLE)
    if ctx.request.gpu_memory_mib is not None:
        # More memory than any GPU of the node has: no preemption can make room there.
        unres |= (codes == Reason.INSUFFICIENT_GPU_MEMORY) & (
            ctx.request.gpu_memory_mib > ctx.mem_total_mib.max(axis=1, initial=0))
    fail = ~ctx.node_fits & ~unres
    return (
        arr[ctx.node_fits].tolist(),
        dict(zip(arr[fail].tolist(), table[codes[fail]].tolist(), strict=True)),
        dict(zip(arr[unres].tolist(), table[codes[unres]].tolist(), strict=True)),
    )


def filter_reply(evaluation: Evaluation, intent: PodIntent, names: Sequence[str],
                 unknown: Sequence[str],
                 node_items: Sequence[Mapping[str, Any]] | None,
                 rejected: str | None = None) -> dict[str, Any]:
    """The ``ExtenderFilterResult`` JSON for an evaluation.

    Built as a plain dict: validating thousands of entries through pydantic would cost more
    than the placement decision.

    Parameters
    ----------
    evaluation, intent, names
        As for ``filter_result``.
    unknown : sequence of str
        Candidates not in gpufrac's cache; they fail with ``NODE_UNKNOWN_MESSAGE``.
    node_items : sequence of mapping or None
        ``ExtenderArgs.Nodes.items`` (nodeCacheCapable false): the passing ones are echoed in
        ``Nodes``; None: passing names go in ``NodeNames``.
    rejected : str or None
        The pod's tenant may not place it (``extender.tenants``): every candidate fails with
        this message in ``FailedAndUnresolvableNodes`` (preempting others cannot help).

    Returns
    -------
    dict
        ``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``.
    """
    if rejected is not None:
        passed, failed = [], {}
        unresolvable = dict.fromkeys([*names, *unknown], rejected)
        unknown = ()
    else:
        passed, failed, unresolvable = filter_result(evaluation, intent, names)
    failed.update(dict.fromkeys(unknown, NODE_UNKNOWN_MESSAGE))
    nodes: dict[str, Any] | None = None
    node_names: list[str] | None = passed
    if node_items is not None:
        keep = set(passed)
        nodes = {"metadata": {}, "items": [it for it in node_items if _item_name(it) in keep]}
        node_names = None
    return {"Nodes": nodes, "NodeNames": node_names, "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable, "Error": ""}


def prioritize_reply(evaluation: Evaluation, names: Sequence[str],
                     unknown: Sequence[str], rejected: str | None = None) -> list[dict[str, Any]]:
    """The ``HostPriorityList`` JSON: ``wire_scores`` per candidate, 0 for unknown nodes (and
    for every node when the tenant may not place the pod, ``rejected``)."""
    scores = [0] * len(names) if rejected is not None else wire_scores(evaluation)
    out = [{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]
    out.extend({"Host": n, "Score": 0} for n in unknown)
    return out


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
    fits = evaluation.context.node_fits
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
