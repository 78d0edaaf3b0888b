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
- ``records``: ``PodRecord`` and the facts about a record they all need.
"""

from extender.cache.records import (
    BindError,
    CandidateEvaluation,
    ClaimCount,
    ClaimedAllocation,
    EventType,
    MetricsView,
    PodRecord,
)
from extender.cache.store import GpuCache
from extender.cache.victims import PreemptBudget

__all__ = ["BindError", "CandidateEvaluation", "ClaimCount", "ClaimedAllocation", "EventType", "GpuCache", "MetricsView", "PodRecord", "PreemptBudget"]
