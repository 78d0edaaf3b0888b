"""How far the cluster-wide terms moved: when an incremental evaluation must score every row anew.

``scoring.incremental`` scores the rows it keeps with the cluster-wide terms frozen when they
were computed (``scoring.fit.ClusterTerms``: the learned workload, the strategies' own terms)
and drops them when the current terms are past a ``Tolerance`` from the frozen ones
(``drifted``). The workload's distance is the total variation distance between two task-type
distributions (``workload_drift``), which costs about a hundred dictionary operations a
call; ``DriftWatch`` asks it only when an upper bound, kept from one evaluation to the
next by the triangle inequality, comes near the tolerance, and so decides as ``drifted``
does at every call (``tests/scoring/test_drift.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from scoring.fit import ClusterTerms
from scoring.fragmentation import TaskTypes, total_variation
from scoring.registry import STRATEGIES, Term


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far the cluster-wide terms may drift before every kept row is scored anew.

    Parameters
    ----------
    workload : float
        Largest total variation distance, in [0, 1], between the frozen and the current
        task-type distribution (``workload_drift``); 0: any change of the counts.
    terms : mapping of str to float
        Per strategy term (``Term.name``: ``cpu_pressure``, ``spare_need``), the largest
        ``Term.drift`` allowed, >= 0; a term not named here: 0, any change.

    Raises
    ------
    ValueError
        If a bound is negative, not finite, or the workload bound is above 1.
    """

    workload: float = 0.0
    terms: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not 0.0 <= self.workload <= 1.0:
            raise ValueError(f"workload: must be in [0, 1], got {self.workload!r}")
        for name, bound in self.terms.items():
            if not 0.0 <= bound < float("inf"):
                raise ValueError(f"{name}: must be a finite number >= 0, got {bound!r}")
        object.__setattr__(self, "terms", MappingProxyType(dict(self.terms)))

    def of(self, term: str) -> float:
        """The bound of one strategy term (0 when not named)."""
        return self.terms.get(term, 0.0)


EXACT = Tolerance(0.0)
"""Drop every kept row whenever the workload or any strategy term changes at all."""

DEFAULT_TOLERANCE = Tolerance(0.01, {s.term.name: s.term.tolerance for s in STRATEGIES.values() if s.term})
"""The shipped tolerance: a 1 % move of the workload distribution, and each strategy term's
own ``TERM_TOLERANCE`` (``adaptive_balance``: 0.002 of effective CPU pressure, 2 % of its
ramp; ``spare_nodes``: 0.01 of a spare-node probability). Measured in ``benchmarks/README.md``."""


def _same_tasks(a: TaskTypes, b: TaskTypes) -> bool:
    if a.count.shape != b.count.shape or a.count.tobytes() != b.count.tobytes():  # what a bind changes (int64 both)
        return False
    return all(
        x is y or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in ((a.gpu_count, b.gpu_count), (a.gpu_milli, b.gpu_milli), (a.cpu_milli, b.cpu_milli),
                     (a.memory_mib, b.memory_mib), (a.model_mask, b.model_mask),
                     (a.gpu_memory_mib, b.gpu_memory_mib))) and a.demand == b.demand


def workload_drift(a: TaskTypes | None, b: TaskTypes | None) -> float:
    """Total variation distance between two workloads: ``1/2 * sum_k |p_a(k) - p_b(k)|``.

    The larger of the distances over the task types (popularity) and over the
    ``TaskTypes.demand`` classes (share of pods).

    Parameters
    ----------
    a, b : TaskTypes or None
        None (no GPU pod known) is at distance 1 from any workload, 0 from None.

    Returns
    -------
    float
        In [0, 1]; 0 when the task types and their popularities are the same.
    """
    if a is b:
        return 0.0
    if a is None or b is None:
        return 1.0

    return max(total_variation(_keyed(a), _keyed(b)), total_variation(_demand_share(a), _demand_share(b)))


def _keyed(t: TaskTypes) -> dict[tuple[int, ...], float]:
    """``{(gpu_count, gpu_milli, cpu_milli, memory_mib, model_mask, gpu_memory_mib): popularity}``."""
    n = t.count.shape[0]
    mask = t.model_mask.tolist() if t.model_mask is not None else [-1] * n
    gpu_mem = t.gpu_memory_mib.tolist() if t.gpu_memory_mib is not None else [0] * n
    keys = zip(t.gpu_count.tolist(), t.gpu_milli.tolist(), t.cpu_milli.tolist(), t.memory_mib.tolist(), mask,
               gpu_mem, strict=True)
    return dict(zip(keys, t.popularity.tolist(), strict=True))


def _demand_share(t: TaskTypes) -> dict[tuple[int, ...], float]:
    if t.demand is None:
        return {}
    total = sum(c for *_, c in t.demand)
    return {(k, r, m, g): c / total for k, r, m, g, c in t.demand}


def drifted(frozen: ClusterTerms, now: ClusterTerms, tolerance: Tolerance, terms: Sequence[Term] = ()) -> bool:
    """True when ``now`` is past ``tolerance`` from ``frozen`` (exactly: differs at all when 0).

    ``terms``: the strategy terms to compare (``Scorer.terms``), each by its own ``drift``.
    """
    if _terms_drifted(frozen, now, tolerance, terms):
        return True
    same = _same_workload(frozen.tasks, now.tasks)
    if same is not None:
        return not same
    assert frozen.tasks is not None and now.tasks is not None
    return tolerance.workload == 0.0 or workload_drift(frozen.tasks, now.tasks) > tolerance.workload


def _terms_drifted(frozen: ClusterTerms, now: ClusterTerms, tolerance: Tolerance, terms: Sequence[Term]) -> bool:
    """``drifted`` but for the workload: the tie band, and each strategy term by its own drift."""
    if frozen.whole_node_unseen != now.whole_node_unseen:  # the tie band turns off (or on)
        return True
    for term in terms:
        before, after = frozen.strategy_terms.get(term.name), now.strategy_terms.get(term.name)
        bound = tolerance.of(term.name)
        if (before != after) if bound == 0.0 else term.drift(before, after) > bound:
            return True
    return False


def _same_workload(a: TaskTypes | None, b: TaskTypes | None) -> bool | None:
    """True or False when the two workloads are the same or differ for certain without a
    distance (one object, or one None; the same counts: a pod moved from waiting to placed);
    None when only ``workload_drift`` says."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    return True if _same_tasks(a, b) else None


ROUNDING = 1e-9
"""Margin below the tolerance within which ``DriftWatch`` computes the distance instead of
trusting its bound (the float sums of the bound and of ``workload_drift`` round differently;
both err by less than 1e-13 on a few hundred types)."""


class DriftWatch:
    """``drifted`` for a sequence of current terms against one frozen set, at less cost.

    The total variation distance is a metric, so ``d(frozen, now) <= d(frozen, seen) +
    d(seen, now)`` for the workload last looked at (``seen``), for the task types and the
    demand classes alike, and so for ``workload_drift``, their larger. The watch keeps an
    upper bound of ``d(frozen, seen)``; ``d(seen, now)`` is cheap when the two list the same
    types in the same order (between two binds the counts change, rarely the order): a few
    array operations instead of two dictionaries. While the bound plus that step stays below
    the tolerance (by ``ROUNDING``) the distance is below it; otherwise it is computed, and
    the bound becomes it. Not thread-safe (``IncrementalScorer`` holds its lock).

    Parameters
    ----------
    tolerance : Tolerance
    terms : sequence of Term
        As ``drifted``'s.
    """

    def __init__(self, tolerance: Tolerance, terms: Sequence[Term]) -> None:
        self.tolerance = tolerance
        self.terms = tuple(terms)
        self._seen: TaskTypes | None = None
        self._bound = 0.0

    def freeze(self, terms: ClusterTerms) -> None:
        """The terms now frozen (a refresh): the distance from them starts at 0."""
        self._seen, self._bound = terms.tasks, 0.0

    def drifted(self, frozen: ClusterTerms, now: ClusterTerms) -> bool:
        """``drifted(frozen, now, self.tolerance, self.terms)``; ``frozen``: the terms of the
        last ``freeze``."""
        if _terms_drifted(frozen, now, self.tolerance, self.terms):
            return True
        same = _same_workload(frozen.tasks, now.tasks)
        if same is not None:
            return not same
        assert frozen.tasks is not None and now.tasks is not None
        limit = self.tolerance.workload
        if limit == 0.0:
            return True
        step = _aligned_drift(self._seen, now.tasks)
        if step is not None and self._bound + step <= limit - ROUNDING:
            self._seen, self._bound = now.tasks, self._bound + step
            return False
        distance = workload_drift(frozen.tasks, now.tasks)
        self._seen, self._bound = now.tasks, distance
        return distance > limit


def _aligned_drift(a: TaskTypes | None, b: TaskTypes) -> float | None:
    """``workload_drift(a, b)`` when both list the same types in the same order and the same
    demand classes (else None): no dictionary, the popularities subtracted in place."""
    if a is None or a.count.shape != b.count.shape or (a.demand is None) != (b.demand is None):
        return None
    for x, y in ((a.gpu_count, b.gpu_count), (a.gpu_milli, b.gpu_milli), (a.cpu_milli, b.cpu_milli),
                 (a.memory_mib, b.memory_mib), (a.model_mask, b.model_mask), (a.gpu_memory_mib, b.gpu_memory_mib)):
        if x is y:  # the same arrays (``WorkloadModel`` keeps them while the types stay)
            continue
        if x is None or y is None or x.tobytes() != y.tobytes():
            return None
    types = 0.5 * float(np.abs(a.popularity - b.popularity).sum())
    if a.demand is None or b.demand is None:
        return types
    if len(a.demand) != len(b.demand):
        return None
    if not a.demand:
        return types
    if a.demand_keys is not None and a.demand_keys is b.demand_keys and a.demand_count is not None \
            and b.demand_count is not None:  # the same classes: their counts, without the tuples
        ca, cb = a.demand_count, b.demand_count
    else:
        da, db = np.array(a.demand, dtype=np.int64), np.array(b.demand, dtype=np.int64)
        if da.shape != db.shape or da.shape[1] != 5 or da[:, :4].tobytes() != db[:, :4].tobytes():
            return None
        ca, cb = da[:, 4], db[:, 4]
    demand = 0.5 * float(np.abs(ca / ca.sum() - cb / cb.sum()).sum())
    return max(types, demand)
