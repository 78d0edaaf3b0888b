"""The defragmentation plan: which running pods to move so that pods waiting for
fragmentation fit (issue 41).

A pending GPU pod *waits for fragmentation* when the GPUs it may use (model, health, ready
node) have at least its request free in sum, yet no node fits it: the room is there, in
pieces. Evicting a few running pods whose controller recreates them elsewhere would make one
node fit it. The plan says which, for the oldest such pods first:

- **Target.** A node the waiting pod may use (its ``nodeSelector`` matches the node's labels;
  the node is ready, has enough GPUs of its models, CPU and memory), tried in order of the
  least share to move off it (the shortfall of its ``k`` best GPUs), at most
  ``MAX_TARGETS_PER_POD``; a node whose shortfall exceeds the free share on all other nodes is
  not tried (the moved pods could not fit).
- **Moves.** On that node, the fewest running pods whose removal makes the waiting pod fit
  (``victims.fewest_victims``, the preemption search): exact by set size while the tries
  last, lowest QoS class first, then lowest priority, then least share. A pod may move when a
  controller recreates it (``MOVABLE_KINDS``), it is of the waiting pod's class or lower and
  of no higher priority, it has no placement rules gpufrac does not evaluate
  (``PodIntent.placement_rules``), gpufrac made its allocation (not assumed, not an
  over-commit), and every PodDisruptionBudget covering it allows one more disruption.
- **Somewhere to go.** A plan that frees a node by pushing its pods into the queue only moves
  the wait. Each moved pod must fit on another node its ``nodeSelector`` matches (not a node
  the plan frees), placed there as the scorer would (``Scorer.evaluate``, best node); the
  plan's later steps see those placements.
- **Choice.** Among the targets that work: fewest moves, then least share moved, then the
  lowest row (deterministic).

The plan is computed on a copy of the cache (``GpuCache.defrag_snapshot``), outside the
cache lock, within ``deadline_s``; it changes nothing. Acting on it (evictions through the
Eviction API, behind ``DefragPolicy.evict``) is ``extender.cluster.defragmenter``'s.

What it cannot see: taints and tolerations, node affinity, pod affinity and topology spread
(pods with the last three are neither moved nor planned for), and kube-scheduler's own
resource counts (a node kube-scheduler filters out for another reason is not known here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.cache.moves import DisruptionBudget, Labels, MoveSearch, Step
from extender.cache.records import WAITING_EXAMINED, PodRecord, is_pending
from extender.translate import inbound
from podspec.pods import PodIntent
from scoring.fit import fragmented_on
from scoring.request import PodRequest
from scoring.scorer import Scorer
from scoring.state import ClusterState

MAX_STEPS = 8
"""Waiting pods one plan makes room for."""
@dataclass(frozen=True, slots=True)
class DefragPolicy:
    """The admin config's ``defragmentation`` section.

    Parameters
    ----------
    evict : bool
        Act on the plan: evict its moves through the Eviction API (cluster mode). Off by default.
    evict_after_s : float
        A step is acted on only once its waiting pod has been seen pending this long, seconds.
    max_evictions_per_hour : int
        Evictions at most in any hour (a sliding window), >= 1.
    plan_every_s : float
        Seconds between plans (cluster mode housekeeping), > 0.
    """

    evict: bool = False
    evict_after_s: float = 600.0
    max_evictions_per_hour: int = 12
    plan_every_s: float = 30.0


NO_DEFRAG = DefragPolicy()
"""Plans shown, never acted on (the default)."""


@dataclass(frozen=True, slots=True)
class DefragPlan:
    """One plan (module notes).

    Attributes
    ----------
    pending : int
        Pending GPU pods in the cache.
    examined : int
        Of those, examined (the oldest ``records.WAITING_EXAMINED``).
    waiting : tuple of str
        The examined pods that wait for fragmentation, oldest first (``namespace/name``).
    steps : tuple of Step
    unplanned : tuple of (str, str)
        Waiting pods with no step, and why.
    """

    pending: int
    examined: int
    waiting: tuple[str, ...]
    steps: tuple[Step, ...]
    unplanned: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())
    """Limits the plan hit (time budget, steps)."""

    @property
    def moves(self) -> int:
        """Evictions the plan asks for."""
        return sum(len(s.moves) for s in self.steps)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``/defrag``, ``gpufrac inspect --defrag --json``)."""
        return {
            "pending_gpu_pods": self.pending, "examined": self.examined,
            "waiting_for_fragmentation": list(self.waiting),
            "steps": [{"pod": s.pod, "uid": s.uid, "node": s.node, "gpu_count": s.gpu_count,
                       "gpu_milli": s.gpu_milli,
                       "moves": [{"pod": m.pod, "uid": m.uid, "node": m.node, "qos": m.qos,
                                  "priority": m.priority, "gpu_milli": m.gpu_milli, "fits_on": m.fits_on,
                                  "controller": m.controller, "budgets": list(m.budgets)} for m in s.moves]}
                      for s in self.steps],
            "unplanned": [{"pod": p, "why": why} for p, why in self.unplanned],
            "notes": list(self.notes),
        }


EMPTY_PLAN = DefragPlan(0, 0, (), ())



def plan_defrag(state: ClusterState, records: Sequence[tuple[str, PodRecord]], scorer: Scorer, *,
         node_labels: Labels,
         budgets: Sequence[DisruptionBudget] | Callable[[], Sequence[DisruptionBudget]] = (),
         deadline_s: float = 2.0) -> DefragPlan:
    """The defragmentation plan (module notes).

    Parameters
    ----------
    state : ClusterState
        A private copy of the cache's arrays (``GpuCache.defrag_snapshot``): the plan applies
        its steps to it as it goes.
    records : sequence of (str, PodRecord)
        Every pod of the cache, oldest event first.
    scorer : Scorer
        Places the moved pods (and the waiting pod's GPUs on its target).
    node_labels : mapping of str to tuple of (str, str)
        Each node's labels (``NodeObservation.labels``); a node missing here matches only
        pods without a ``nodeSelector``.
    budgets : sequence of DisruptionBudget, or a callable returning one
        The PodDisruptionBudgets of the pods' namespaces; a callable is called once, only when
        some pod waits for fragmentation (cluster mode reads them from the API).
    deadline_s : float
        Wall time for the whole plan, seconds; the steps found by then are returned.

    Returns
    -------
    DefragPlan
    """
    deadline = time.monotonic() + deadline_s
    pending = [(uid, rec) for uid, rec in records if is_pending(rec)]
    examined = pending[:WAITING_EXAMINED]
    planner = MoveSearch(state, scorer, node_labels, deadline)
    waiting: list[tuple[str, PodIntent, PodRequest]] = []
    for uid, rec in examined:
        request = inbound.pod_request(rec.intent, state)
        if fragmented_on(state, request, planner.allowed_rows(rec.intent.node_selector)):
            waiting.append((uid, rec.intent, request))
    if not waiting:
        return DefragPlan(len(pending), len(examined), (), ())
    planner.set_budgets(budgets() if callable(budgets) else budgets)
    for uid, rec in records:
        planner.add_running(uid, rec)
    steps: list[Step] = []
    unplanned: list[tuple[str, str]] = []
    notes: list[str] = []
    for uid, intent, request in waiting:
        if len(steps) >= MAX_STEPS:
            notes.append(f"{MAX_STEPS} steps planned; the other waiting pods wait for the next plan")
            break
        if time.monotonic() > deadline:
            notes.append(f"time budget ({deadline_s:g} s) spent; the other waiting pods wait for the next plan")
            break
        step, why = planner.step(uid, intent, request)
        if step is None:
            unplanned.append((intent.key, why))
        else:
            steps.append(step)
    return DefragPlan(len(pending), len(examined), tuple(i.key for _, i, _ in waiting), tuple(steps),
                      tuple(unplanned), tuple(notes))


