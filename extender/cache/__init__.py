"""The extender's cache: every node's GPUs and every pod's allocation, as one ``ClusterState``.

One module per responsibility:

- ``store``: ``GpuCache``, the facade: the one lock, routing to the modules below;
- ``assume``: assume (bind), forget, expire, and other instances' claims;
- ``victims``: preemption's bounded victim search on a one-row copy of the state;
- ``views``: ``allocations``, ``summary``, ``metrics_view``;
- ``evaluation``: the pod scored on the candidates (filter, prioritize, bind's re-check),
  with the memos of the last candidate list and evaluation;
- ``ledger``: the arrays and pod records, and the node, pod and namespace events that
  change them; the only writer of the state;
- ``accounting``: which allocation records read back from pods are trusted, and what is
  counted of the others (over-commits);
- ``tenancy``: per-namespace usage, namespace labels, admission against tenant rules;
- ``records``: ``PodRecord`` and the facts about a record they all need;
- ``reservations``: starvation protection, nodes held for pods that waited too long;
- ``defrag``: the defragmentation plan (which running pods to move), over ``moves``: the
  bounded search for where a moved pod goes, within disruption budgets.

This package is the cache's one front door: code outside ``extender/cache/`` imports the
names below and nothing from the modules (an import-linter contract in pyproject.toml).
"""

from extender.cache.defrag import EMPTY_PLAN, NO_DEFRAG, DefragPlan, DefragPolicy, plan_defrag
from extender.cache.moves import DisruptionBudget, Labels, Move, Step
from extender.cache.records import (
    EMPTY_VIEW,
    BindError,
    CandidateEvaluation,
    ClaimCount,
    ClaimedAllocation,
    EventType,
    MetricsView,
    PodRecord,
    Receipt,
    is_pending,
)
from extender.cache.reservations import DEFAULT_STARVATION, NO_RESERVATIONS, StarvationPolicy
from extender.cache.store import GpuCache
from extender.cache.victims import PreemptBudget
from extender.cache.views import GpuRoom

__all__ = [
    "DEFAULT_STARVATION", "EMPTY_PLAN", "EMPTY_VIEW", "NO_DEFRAG", "NO_RESERVATIONS", "BindError",
    "CandidateEvaluation", "ClaimCount", "ClaimedAllocation", "DefragPlan", "DefragPolicy", "DisruptionBudget",
    "EventType", "GpuCache", "GpuRoom", "Labels", "MetricsView", "Move", "PodRecord", "PreemptBudget", "Receipt", "StarvationPolicy", "Step", "is_pending", "plan_defrag",
]
