"""The extender's cache: every node's GPUs and every pod's allocation, as one ``ClusterState``.

One module per responsibility:

- ``store``: ``GpuCache``, the store and the watch inputs (nodes, pods, namespaces), bind,
  assume/forget/expire, reads; the only writer of the state, under one lock;
- ``accounting``: which allocation records read back from pods are trusted, and what is
  counted of the others (over-commits);
- ``tenancy``: per-namespace usage, namespace labels, admission against tenant rules;
- ``victims``: preemption's bounded victim search on a one-row copy of the state;
- ``records``: ``PodRecord`` and the facts about a record they all need.
"""

from extender.cache.records import (
    BindError,
    CandidateEvaluation,
    ClaimedAllocation,
    ClaimHold,
    EventType,
    MetricsView,
    PodRecord,
)
from extender.cache.store import GpuCache
from extender.cache.victims import PreemptBudget

__all__ = ["BindError", "CandidateEvaluation", "ClaimHold", "ClaimedAllocation", "EventType", "GpuCache", "MetricsView", "PodRecord", "PreemptBudget"]
