"""``gpufrac inspect``: the cluster's GPU allocation as recorded in the API.

Like ``kubectl inspect gpushare``, with QoS, memory and replica slots: for every node with a
``gpufrac.io/inventory``, each GPU's share, memory and replica slots used and free, and the
pods on it. Read from the API (Nodes and Pods), not from a running extender, so it shows
what survives a restart: the allocation record gpufrac writes on pods at bind. With ``--url``
it reads a running gpufrac instead (``/nodes`` and ``/allocations``: ``served``), what that
replica counts: the only way to look at a standalone extender, which has no API to read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from podspec.nodes import node_observation
from podspec.pods import pod_intent
from scoring.request import MILLI_PER_GPU, QoSClass


@dataclass
class GpuReport:
    """One GPU: capacity, what is allocated on it, and by whom."""

    index: int
    uuid: str
    model: str
    healthy: bool
    memory_mib: int
    replicas: int
    share_used_milli: int = 0
    memory_used_mib: int = 0
    pods: list[dict[str, Any]] = field(default_factory=list)
    reserved_milli: int = 0
    """The share of its non-best-effort pods (at most 1000 for any allocation gpufrac makes)."""

    @property
    def overcommitted(self) -> bool:
        """More reserved share, memory or pods than the GPU has: records gpufrac did not make
        (forged, or bound outside it), which the extender counts only up to what was free."""
        return (self.reserved_milli > MILLI_PER_GPU or self.memory_used_mib > self.memory_mib
                or len(self.pods) > self.replicas)

    @property
    def share_free_milli(self) -> int:
        return MILLI_PER_GPU - self.share_used_milli

    @property
    def memory_free_mib(self) -> int:
        return self.memory_mib - self.memory_used_mib

    @property
    def replicas_used(self) -> int:
        return len(self.pods)

    def as_dict(self) -> dict[str, Any]:
        """JSON form, with the derived free amounts."""
        return {**asdict(self), "share_free_milli": self.share_free_milli,
                "memory_free_mib": self.memory_free_mib, "replicas_used": self.replicas_used,
                "replicas_free": self.replicas - self.replicas_used, "overcommitted": self.overcommitted}


@dataclass
class NodeReport:
    """One node with an inventory."""

    name: str
    inventory_fresh: bool
    problem: str
    gpus: list[GpuReport]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "inventory_fresh": self.inventory_fresh, "problem": self.problem,
                "gpus": [g.as_dict() for g in self.gpus]}


def gather(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
           stale_after_s: float, now: datetime | None = None) -> list[NodeReport]:
    """Aggregate Node and Pod objects (API JSON) into per-GPU reports, sorted by node name.

    A bound, unfinished pod counts on each GPU in ``gpufrac.io/assigned-gpus`` with its
    recorded share and memory (``assigned-fraction``, ``assigned-memory``). Pods whose
    annotations do not parse are left out (gpufrac never bound them).
    """
    now = now or datetime.now(UTC)
    reports: dict[str, NodeReport] = {}
    by_uuid: dict[str, GpuReport] = {}
    for node in nodes:
        obs = node_observation(node)
        if not obs.gpus and obs.problem.startswith("no "):
            continue  # not a GPU node
        gpus = [GpuReport(g.index, g.uuid, g.model, g.healthy, g.memory_mib, g.replicas) for g in obs.gpus]
        by_uuid.update((g.uuid, g) for g in gpus)
        reports[obs.name] = NodeReport(obs.name, obs.spec(now, stale_after_s).ready, obs.problem, gpus)
    for pod in pods:
        try:
            intent = pod_intent(pod)
        except ValueError:
            continue
        if not intent.node_name or intent.finished or not intent.assigned_gpus:
            continue
        _count(by_uuid, intent.key, intent.qos.wire_name, intent.assigned_gpu_milli or intent.gpu_milli,
               intent.assigned_gpus, intent.assigned_memory_mib or (0,) * len(intent.assigned_gpus))
    return [reports[n] for n in sorted(reports)]


def _count(by_uuid: Mapping[str, GpuReport], pod: str, qos: str, milli: int,
           uuids: Sequence[str], memory_mib: Sequence[int]) -> None:
    """Count one pod's allocation on each of its GPUs (``uuids``, with the memory on each);
    a GPU not among ``by_uuid`` is skipped. Best-effort share is used, not reserved."""
    for uuid, mem in zip(uuids, memory_mib, strict=True):
        gpu = by_uuid.get(uuid)
        if gpu is None:
            continue
        gpu.share_used_milli += milli
        if qos != QoSClass.BEST_EFFORT.wire_name:
            gpu.reserved_milli += milli
        gpu.memory_used_mib += mem
        gpu.pods.append({"pod": pod, "qos": qos, "milli": milli, "memory_mib": mem})


STALE_PROBLEM = "inventory stale or missing: this gpufrac refuses the node GPU pods"


def served(nodes: Iterable[Mapping[str, Any]], allocations: Iterable[Mapping[str, Any]]) -> list[NodeReport]:
    """Per-GPU reports from what a running gpufrac serves: ``/nodes`` and ``/allocations``.

    Each allocation counts its recorded share (``gpu_milli``) and its memory on each GPU of
    ``gpu_uuids``, as ``gather`` counts a pod's annotations, so a record gpufrac could not
    have made shows as ``OVERCOMMIT`` here too.

    Raises
    ------
    ValueError
        When either body is not the shape those endpoints serve (another service at the URL).
    """
    try:
        reports = [NodeReport(str(n["name"]), bool(n["ready"]), "" if n["ready"] else STALE_PROBLEM,
                              [GpuReport(int(g["index"]), str(g["uuid"]), str(g["model"]), bool(g["healthy"]),
                                         int(g["memory_mib"]), int(g["replicas"])) for g in n["gpus"]])
                   for n in nodes]
        by_uuid = {g.uuid: g for r in reports for g in r.gpus}
        for a in allocations:
            _count(by_uuid, f"{a['namespace']}/{a['name']}", str(a["qos"]), int(a["gpu_milli"]),
                   [str(u) for u in a["gpu_uuids"]], [int(m) for m in a["gpu_memory_mib"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not what gpufrac's /nodes and /allocations serve ({type(exc).__name__}: {exc})") from exc
    return sorted(reports, key=lambda r: r.name)


def in_namespaces(key: str, namespaces: Sequence[str] | None) -> bool:
    """Whether pod ``namespace/name`` is in ``namespaces`` (None: every namespace)."""
    return namespaces is None or key.split("/", 1)[0] in namespaces


def select(reports: list[NodeReport], nodes: Sequence[str] = (),
           namespaces: Sequence[str] | None = None) -> list[NodeReport]:
    """The reports of ``nodes`` (all when empty), and with ``namespaces`` given only the GPUs
    holding a pod of one of them (and only those pods listed). A GPU's used and free amounts
    stay its own: every pod on it counts, listed or not.
    """
    out = []
    for r in reports:
        if nodes and r.name not in nodes:
            continue
        if namespaces is None:
            out.append(r)
            continue
        gpus = []
        for g in r.gpus:
            mine = [p for p in g.pods if in_namespaces(p["pod"], namespaces)]
            if mine:
                gpus.append(replace(g, pods=mine))
        if gpus:
            out.append(NodeReport(r.name, r.inventory_fresh, r.problem, gpus))
    return out


def rejected_pods(pods: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Pods that concern gpufrac (a ``gpufrac.io/gpu`` request or a ``gpufrac.io/`` annotation)
    but cannot be read: gpufrac skips them (its ``/quarantine``). ``(namespace/name, why)``."""
    out = []
    for pod in pods:
        try:
            pod_intent(pod)
        except ValueError as exc:
            text = str(pod)
            if "gpufrac.io/" in text:
                meta = pod.get("metadata") or {}
                out.append((f"{meta.get('namespace', '?')}/{meta.get('name', '?')}", str(exc)))
    return out


def render_table(reports: list[NodeReport], rejected: Sequence[tuple[str, str]] = ()) -> str:
    """A fixed-width text table, one row per GPU, then cluster totals."""
    header = ("NODE", "GPU", "MODEL", "SHARE USED/FREE", "MEM MiB USED/FREE", "REPLICAS USED/FREE", "PODS (QOS)")
    rows: list[tuple[str, ...]] = []
    used = total = 0
    for node in reports:
        flag = "" if node.inventory_fresh else " (stale)"
        for g in node.gpus:
            pods = ", ".join(f"{p['pod']}({p['qos']})" for p in g.pods) or "-"
            health = ("" if g.healthy else " UNHEALTHY") + (" OVERCOMMIT" if g.overcommitted else "")
            rows.append((node.name + flag, str(g.index), g.model + health,
                         f"{g.share_used_milli / 1000:.3g}/{g.share_free_milli / 1000:.3g}",
                         f"{g.memory_used_mib}/{g.memory_free_mib}",
                         f"{g.replicas_used}/{g.replicas - g.replicas_used}", pods))
            used += g.share_used_milli
            total += MILLI_PER_GPU
        if not node.gpus:
            rows.append((node.name + flag, "-", node.problem, "", "", "", ""))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
             for r in [header, *rows]]
    pct = 100 * used / total if total else 0.0
    lines.append(f"\n{len(reports)} nodes, {total // MILLI_PER_GPU} GPUs, "
                 f"{used / 1000:.3f} GPUs allocated ({pct:.1f}%)")
    if rejected:
        lines.append(f"\n{len(rejected)} pod(s) gpufrac cannot read (skipped, not counted):")
        lines.extend(f"  {key}: {why}" for key, why in rejected)
    return "\n".join(lines)


def render_defrag(plan: Mapping[str, Any]) -> str:
    """The defragmentation plan (``DefragPlan.as_dict``) as text: one block per step."""
    lines = [f"{len(plan['waiting_for_fragmentation'])} of {plan['examined']} pending GPU pod(s) examined "
             f"wait for fragmentation (room free in sum, on no single node)"
             + (f"; {plan['pending_gpu_pods']} pending in all" if plan["pending_gpu_pods"] > plan["examined"] else "")]
    for step in plan["steps"]:
        milli = step["gpu_milli"] / 1000
        lines.append(f"\n{step['pod']} ({step['gpu_count']} x {milli:g} GPU): free node {step['node']} by moving")
        for m in step["moves"]:
            pdb = f", PDB {', '.join(m['budgets'])}" if m["budgets"] else ""
            lines.append(f"  {m['pod']} ({m['qos']}, {m['gpu_milli'] / 1000:g} GPU, {m['controller']}{pdb})"
                         f" -> fits on {m['fits_on']}")
    for u in plan["unplanned"]:
        lines.append(f"\n{u['pod']}: no step: {u['why']}")
    lines.extend(f"\n({note})" for note in plan["notes"])
    if not plan["steps"] and not plan["unplanned"]:
        lines.append("\nnothing to move")
    return "\n".join(lines)
