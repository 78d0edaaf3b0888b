"""Pods as gpufrac reads them: the bounded parse of a Pod object into a ``PodIntent``, and the
allocation record gpufrac writes on a pod at bind (``allocation_annotations``) and reads back.

Every quantity from a pod is parsed here, once, into a bounded value before anything is
sized by it (the bounds and parsers: ``podspec.quantities``). Every parse error is a
``PodSpecError`` whose message names the field, the offending value (quoted, truncated) and
the rule. Shared by the extender (which
turns a ``PodIntent`` into a ``scoring.PodRequest``) and the node agent's device plugin (which
matches the record to kubelet's ``Allocate``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from podspec import annotations as ann
from podspec.claims import pod_claim_refs
from podspec.quantities import (
    INT32,
    MAX_CORES,
    MAX_CPU_MILLI,
    MAX_GPU_MEMORY_BYTES,
    MAX_GPUS_PER_POD,
    MAX_MEMORY_BYTES,
    MAX_MEMORY_MIB,
    MAX_MODELS,
    MAX_NAME_CHARS,
    MIB,
    PodSpecError,
    bounded_text,
    fraction_milli,
    quantity,
    quote,
)
from scoring.request import MILLI_PER_GPU, QoSClass

_QOS_BY_NAME = {q.wire_name: q for q in QoSClass}


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
    controller : str
        ``Kind/name`` of the owner reference marked ``controller`` (what recreates the pod if it
        is evicted); ``""`` when there is none or it cannot be read.
    node_selector : tuple of (str, str)
        ``spec.nodeSelector``, sorted; read leniently (``placement_rules`` set when unreadable).
    labels : tuple of (str, str)
        ``metadata.labels``, sorted, at most ``MAX_SELECTOR_TERMS`` (empty when unreadable or
        more): what a PodDisruptionBudget's selector is matched against.
    placement_rules : bool
        The pod has placement rules gpufrac does not evaluate: required node affinity, pod
        affinity or anti-affinity, hard topology spread constraints, or an unreadable
        ``nodeSelector``. The defragmentation plan neither moves such a pod nor plans for it.
    created_at : str
        ``metadata.creationTimestamp`` as the API server writes it (``2026-11-27T11:09:55Z``),
        ``""`` when absent or in any other form. Only ordered, never compared with a clock: a
        pod list is counted as arrivals oldest first (``scoring.workload.WorkloadModel``).
    resource_claims : tuple of str
        The ResourceClaims the pod uses, by name (``podspec.claims.pod_claim_refs``; ``""``
        for one a template will make that kube-controller-manager has not made yet).
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
    controller: str = ""
    node_selector: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    placement_rules: bool = False
    created_at: str = ""
    resource_claims: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name`` for messages."""
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        """True once the pod can no longer use its allocation."""
        return self.phase in ("Succeeded", "Failed")



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
        q = quantity(raw_gpu, field, maximum=MAX_GPUS_PER_POD, unit=" GPUs")
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
        q = quantity(cpu, f"{where}.resources.requests.cpu", maximum=MAX_CORES,
                      unit=" cores")
        cpu_milli = math.ceil(q * 1000)
    if mem is not None and mem != "":
        q = quantity(mem, f"{where}.resources.requests.memory", maximum=MAX_MEMORY_BYTES,
                      unit=" bytes")
        mem_mib = math.ceil(q / MIB)
    return gpus, cpu_milli, mem_mib


def pod_intent(pod: Mapping[str, Any], defrag_fields: bool = True) -> PodIntent:
    """Parse a Pod object (API JSON, as in ``ExtenderArgs.Pod`` or a watch event).

    Every quantity is bounded here (``MAX_GPUS_PER_POD``, ``MAX_CPU_MILLI``,
    ``MAX_MEMORY_MIB``, ``MAX_GPU_MEMORY_MIB``, int32 priority), so a ``PodIntent`` always
    makes a valid ``scoring.PodRequest`` and nothing in it can size an array past the
    cluster's own dimensions.

    Parameters
    ----------
    pod : mapping
        The Pod JSON.
    defrag_fields : bool
        Read what only the defragmentation plan needs (``controller``, ``node_selector``,
        ``labels``, ``placement_rules``); the verbs (filter, prioritize, preempt) skip them,
        a tenth of the parse, since the pods the plan reads come from the cache.

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
    name = bounded_text(meta.get("name"), "Pod.metadata.name")
    if not name:
        raise PodSpecError("Pod.metadata.name: missing")
    namespace = bounded_text(meta.get("namespace") or "default", "Pod.metadata.namespace", 63)
    uid = bounded_text(meta.get("uid") or "", "Pod.metadata.uid", 128)
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
        milli = fraction_milli(annotations[ann.FRACTION])
        if milli < MILLI_PER_GPU and gpu_count > 1:
            raise PodSpecError(
                f"{ann.FRACTION}: {quote(annotations[ann.FRACTION])} is below 1 but the pod asks for "
                f"{gpu_count} GPUs ({ann.RESOURCE_GPU}); a share below 1 needs exactly 1 GPU"
            )
    gpu_mem: int | None = None
    if ann.MEMORY in annotations:
        raw = annotations[ann.MEMORY]
        q = quantity(bounded_text(raw, ann.MEMORY, 64), ann.MEMORY, maximum=MAX_GPU_MEMORY_BYTES,
                      unit=" bytes", positive=True)
        gpu_mem = math.ceil(q / MIB)
    models: frozenset[str] | None = None
    if ann.GPU_MODEL in annotations:
        raw = bounded_text(annotations[ann.GPU_MODEL], ann.GPU_MODEL, MAX_MODELS * 65)
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
    selector, rules = _placement(spec) if defrag_fields else ((), False)
    return PodIntent(
        uid=uid,
        namespace=namespace,
        name=name,
        node_name=bounded_text(spec.get("nodeName") or "", "Pod.spec.nodeName"),
        phase=bounded_text(status.get("phase") or "Pending", "Pod.status.phase", 32),
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
        scheduler_name=bounded_text(spec.get("schedulerName") or "", "Pod.spec.schedulerName"),
        priority=priority,
        controller=_controller(meta.get("ownerReferences")) if defrag_fields else "",
        node_selector=selector,
        labels=(_pairs(meta.get("labels")) or ()) if defrag_fields else (),
        placement_rules=rules,
        created_at=_created_at(meta.get("creationTimestamp")) if defrag_fields else "",
        resource_claims=pod_claim_refs(pod) if spec.get("resourceClaims") else (),
    )


_RFC3339_SECONDS = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z", re.ASCII)
"""The form the API server writes ``creationTimestamp`` in (UTC, whole seconds): ordered as text."""


def _created_at(raw: Any) -> str:
    """``creationTimestamp`` in the API server's own form, else ``""`` (lenient: only an order)."""
    return raw if isinstance(raw, str) and _RFC3339_SECONDS.fullmatch(raw) else ""


MAX_SELECTOR_TERMS = 64
"""``nodeSelector`` entries read; a pod with more counts as having ``placement_rules``."""


def _controller(refs: Any) -> str:
    """``Kind/name`` of the controlling owner reference; ``""`` when none or unreadable (the
    API server validates these, so only a forged object fails, and it is then not movable)."""
    if not isinstance(refs, list):
        return ""
    for ref in refs[:MAX_SELECTOR_TERMS]:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            kind, name = ref.get("kind"), ref.get("name")
            if isinstance(kind, str) and isinstance(name, str) and 0 < len(kind) <= 63 and 0 < len(name) <= 253:
                return f"{kind}/{name}"
            return ""
    return ""


def _pairs(raw: Any) -> tuple[tuple[str, str], ...] | None:
    """A string map (labels, a nodeSelector), sorted; None when it is not one or has more than
    ``MAX_SELECTOR_TERMS`` entries (keys up to 317 characters, values up to 63, as the API's)."""
    if (isinstance(raw, Mapping) and len(raw) <= MAX_SELECTOR_TERMS
            and all(isinstance(k, str) and isinstance(v, str) and len(k) <= 317 and len(v) <= 63
                    for k, v in raw.items())):
        return tuple(sorted(raw.items()))
    return None


def _placement(spec: Mapping[str, Any]) -> tuple[tuple[tuple[str, str], ...], bool]:
    """``(nodeSelector, placement_rules)`` (``PodIntent``): lenient, since only the
    defragmentation plan reads them, and it leaves a pod it cannot read where it is."""
    pairs = _pairs(spec.get("nodeSelector") or {})
    selector = pairs or ()
    rules = pairs is None
    affinity = spec.get("affinity") or {}
    if not isinstance(affinity, Mapping):
        rules = True
    else:
        node_aff = affinity.get("nodeAffinity") or {}
        if not isinstance(node_aff, Mapping) or node_aff.get("requiredDuringSchedulingIgnoredDuringExecution"):
            rules = True
        for key in ("podAffinity", "podAntiAffinity"):
            pod_aff = affinity.get(key) or {}
            if not isinstance(pod_aff, Mapping) or pod_aff.get("requiredDuringSchedulingIgnoredDuringExecution"):
                rules = True
    spread = spec.get("topologySpreadConstraints") or []
    if not isinstance(spread, list) or any(
            not isinstance(c, Mapping) or c.get("whenUnsatisfiable", "DoNotSchedule") != "ScheduleAnyway"
            for c in spread):
        rules = True
    return selector, rules


def _assigned_share(annotations: Mapping[str, Any], n_gpus: int) -> tuple[int | None, tuple[int, ...]]:
    """Read back the share and memory gpufrac wrote at bind; lenient (None/() if unreadable).

    These annotations are gpufrac's own record, not user input: if someone edited them into
    nonsense the pod's request is used instead, and the allocation stays accounted.
    """
    milli: int | None = None
    try:
        milli = fraction_milli(annotations[ann.ASSIGNED_FRACTION], ann.ASSIGNED_FRACTION)
    except (KeyError, PodSpecError):
        pass
    mem: tuple[int, ...] = ()
    raw = annotations.get(ann.ASSIGNED_MEMORY)
    if raw and isinstance(raw, str):
        try:
            values = tuple(math.ceil(quantity(v, ann.ASSIGNED_MEMORY, positive=True,
                                               maximum=MAX_GPU_MEMORY_BYTES) / MIB)
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


def item_name(item: Any) -> str | None:
    """``metadata.name`` of a Node item of any shape; None when it has none."""
    meta = item.get("metadata") if isinstance(item, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name and len(name) <= MAX_NAME_CHARS else None
