"""The workload distribution learned online: the GPU pods the cluster holds or awaits.

FGD (Weng et al., USENIX ATC '23) measures fragmentation against a target workload, a
distribution over task types. The paper takes it from the trace; gpufrac learns it from the
demand: every GPU allocation added to the ``ClusterState`` counts its task type
``(gpu_count, gpu_milli, cpu_milli, memory_mib, model_mask, gpu_memory_mib)``, every release uncounts it, and the
extender's cache counts the GPU pods still waiting for a node the same way (a pod that fits
nowhere is exactly the kind fragmentation must serve). Counting the waiting pods too moved
FGD from 5.02 % to 4.87 % unallocated at 100 % arrived (openb seed 42). The
``max_types`` most frequent types, renormalised, form the ``TaskTypes`` the ``fgd``
strategy uses (fewer types keep the kernel cheap; the tail carries little weight). Their
``TaskTypes.demand`` counts every pod by (GPUs, share, models, GPU memory) for the
cutting-stock prices, whose classes ignore CPU and host memory: there the tail is whole pods
restricted to rare models, or asking more GPU memory than most GPUs have.

The counts start from a prior of the shapes the cluster's nodes can host
(``scoring.shape_prior.ShapePrior``), which real demand outgrows but never erases.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from scoring.arrivals import ARRIVAL_UNITS, RUNNING, ArrivalHistory, Learning, TaskKey
from scoring.fragmentation import TaskTypes
from scoring.request import ANY_MODEL_MASK, MILLI_PER_GPU
from scoring.shape_prior import NO_PRIOR, ShapePrior

DEMAND_MEMORY_STEP_MIB = 1024
"""Explicit GPU memory is counted in ``TaskTypes.demand`` rounded up to this (GPU sizes are
whole GiB: a pod fits a GPU's memory exactly when its rounded request does), so that a
memory-heavy list makes tens of demand classes, not one per pod."""


def demand_memory_mib(gpu_memory_mib: int) -> int:
    """Explicit GPU memory per GPU as ``TaskTypes.demand`` counts it: rounded up to
    ``DEMAND_MEMORY_STEP_MIB`` (0 stays 0: a share's proportion), MiB."""
    step = DEMAND_MEMORY_STEP_MIB
    return -(-max(gpu_memory_mib, 0) // step) * step

@dataclass(slots=True)
class _Counted:
    """The counted pods as every reader needs them (``WorkloadModel._view``)."""

    counts: dict[TaskKey, int]
    share_by_gpus: dict[int, int]
    demand: dict[tuple[int, int, int, int], int]
    observed: int
    unit: int
    """Count units per pod (1 for the running counts, ``ARRIVAL_UNITS`` for the arrival mix)."""


class WorkloadModel:
    """Counts of task types among GPU pods: placed and waiting, or arrived (``Learning``).

    Parameters
    ----------
    max_types : int
        How many of the most frequent observed types ``task_types`` returns (the prior's
        shapes come on top: they are few, and rare by construction).

    Notes
    -----
    Two counts are kept side by side, whatever ``Learning.learn_from`` reads: the **running**
    count (``add`` counts a pod placed, by ``ClusterState.apply``, or waiting, by the cache,
    and uncounts it when it leaves or is placed) and the **arrival history**
    (``scoring.arrivals.ArrivalHistory``: ``arrive`` counts a GPU pod once when first seen,
    decayed by arrivals; ``depart`` a pod that held GPUs leaving).

    The running count depends only on the multiset of counted pods, the prior and the node
    sizes, never on the order of ``add`` calls (ties in frequency are broken by the type's
    key): a restarted extender that lists the same pods, and every replica, learn the same
    one. The arrival history depends on the order of the arrivals: replicas that saw the same
    pod events hold the same one; an extender rebuilt from a list (start-up, a relist) counts
    the listed pods as arrivals in the order of their ``creationTimestamp`` and has no
    departures yet, so it holds less than one that watched all along, until the pods it
    missed have decayed (a few half-lives).
    """

    def __init__(self, max_types: int = 48) -> None:
        self.max_types = max_types
        self._counts: dict[TaskKey, int] = {}
        self._share_by_gpus: dict[int, int] = {}
        self._demand: dict[tuple[int, int, int, int], int] = {}
        self._observed = 0
        self._pending: dict[TaskKey, int] = {}
        self._learning = RUNNING
        self.history = ArrivalHistory(RUNNING.half_life_pods)
        self._prior = NO_PRIOR
        self._prior_shapes: tuple[tuple[int, int, int], ...] = ()
        self._prior_counts: dict[tuple[int, int], int] | None = None
        self._largest_node = 0
        self._whole_node_seen: bool | None = None
        self._view_cache: _Counted | None = None
        self._cached: TaskTypes | None = None
        self._keys: tuple[TaskKey, ...] = ()
        """The type keys of ``_cached``, in its order."""
        self._dirty = False
        self._net: dict[TaskKey, int] | None = None
        """Net ``add`` per type since ``_cached`` was computed (None: something else changed)."""

    # -- what is counted ---------------------------------------------------------------------

    def add(self, key: TaskKey, sign: int, pending: bool = False) -> None:
        """Count (``sign=1``) or uncount (``sign=-1``) one pod of type ``key`` placed or
        waiting (``pending``: a waiting pod, which the arrival mix counts as well)."""
        k, share = key[0], min(key[1], MILLI_PER_GPU)
        if self._net is not None:  # a pod moving from waiting to placed nets to nothing
            if self._counts.get(key, 0) + sign < 0 or self._observed + sign < 0:
                self._net = None
            else:
                self._net[key] = self._net.get(key, 0) + sign
        _bump(self._counts, key, sign)
        _bump(self._share_by_gpus, k, sign * k * share)
        _bump(self._demand, (k, share, key[4], demand_memory_mib(key[5])), sign)
        self._observed = max(0, self._observed + sign)
        if pending:
            _bump(self._pending, key, sign)
        self._changed(running=True, counted=True)

    def arrive(self, key: TaskKey) -> None:
        """A GPU pod of type ``key`` seen for the first time (``ArrivalHistory.arrive``)."""
        self.history.arrive(key)
        if key[1] >= MILLI_PER_GPU:
            self._whole_node_seen = None
        self._changed(running=False)

    def depart(self) -> None:
        """A pod that held GPUs has left (deleted or finished)."""
        self.history.depart()

    def churn(self) -> float:
        """``ArrivalHistory.churn``: departures over arrivals, decayed, in [0, 1]."""
        return self.history.churn()

    def pending_share(self) -> int:
        """GPU share the waiting GPU pods ask for together, milli-GPU (``add(..., pending=True)``)."""
        return sum(n * key[0] * min(key[1], MILLI_PER_GPU) for key, n in self._pending.items())

    def _changed(self, running: bool, counted: bool = False) -> None:
        if running or self._learning.learn_from == "arrivals":
            self._prior_counts = None
            self._whole_node_seen = None
            self._view_cache = None
            self._dirty = True
            if not counted or self._learning.learn_from != "running":
                self._net = None

    def _view(self) -> _Counted:
        """The counted pods of ``Learning.learn_from``, in count units (kept until a change)."""
        if self._learning.learn_from == "running":
            return _Counted(self._counts, self._share_by_gpus, self._demand, self._observed, 1)
        if self._view_cache is None:
            unit = ARRIVAL_UNITS
            now = self.history.weight_now()
            counts: dict[TaskKey, int] = {}
            for key, w in self.history.by_key.items():
                c = round(w / now * unit)
                if c > 0:
                    counts[key] = c
            for key, n in self._pending.items():
                counts[key] = counts.get(key, 0) + n * unit
            share: dict[int, int] = {}
            demand: dict[tuple[int, int, int, int], int] = {}
            for key, c in counts.items():
                k, milli = key[0], min(key[1], MILLI_PER_GPU)
                share[k] = share.get(k, 0) + c * k * milli
                dk = (k, milli, key[4], demand_memory_mib(key[5]))
                demand[dk] = demand.get(dk, 0) + c
            self._view_cache = _Counted(counts, share, demand, sum(counts.values()) // unit, unit)
        return self._view_cache

    # -- configuration -----------------------------------------------------------------------

    def set_learning(self, learning: Learning) -> None:
        """Read ``learning.learn_from`` from now on (the history is kept either way)."""
        if learning != self._learning:
            self.history.set_half_life(learning.half_life_pods)
            self._learning = learning
            self._changed(running=True)

    @property
    def learning(self) -> Learning:
        """The learning in use (``RUNNING`` until ``set_learning``)."""
        return self._learning

    def set_prior(self, prior: ShapePrior, node_sizes: Iterable[int]) -> None:
        """Use ``prior``, its automatic shapes resolved against ``node_sizes`` (GPUs per node).

        Parameters
        ----------
        prior : ShapePrior
        node_sizes : iterable of int
            GPUs per GPU node of the cluster.
        """
        sizes = list(node_sizes)
        self._largest_node = max(sizes, default=0)
        self._whole_node_seen = None
        shapes = prior.resolve(sizes)
        if prior != self._prior or shapes != self._prior_shapes:
            self._prior, self._prior_shapes = prior, shapes
            self._prior_counts = None
            self._dirty, self._net = True, None

    @property
    def prior(self) -> ShapePrior:
        """The prior in use (``NO_PRIOR`` until ``set_prior``)."""
        return self._prior

    # -- what the strategies read ------------------------------------------------------------

    def prior_counts(self) -> dict[tuple[int, int], int]:
        """``(gpu_count, gpu_milli) -> pseudo-pods`` the prior adds now, in count units (pods,
        or 1/``ARRIVAL_UNITS`` pod for the arrival mix); kept until the counts or the prior
        change: ``share_by_gpu_count`` asks on every evaluation."""
        if self._prior_counts is None:
            view = self._view()
            held = {(k, share) for k, share, _, _ in view.demand}
            fractional = any(share < MILLI_PER_GPU for _, share in held)
            seen = tuple((k, milli) in held if milli == MILLI_PER_GPU else fractional
                         for k, milli, _ in self._prior_shapes)
            counts = self._prior.counts(self._prior_shapes, view.observed, seen)
            self._prior_counts = {(k, m): c * view.unit
                                  for (k, m, _), c in zip(self._prior_shapes, counts, strict=True)}
        return dict(self._prior_counts)

    def whole_node_seen(self) -> bool:
        """Whether the pods that take every GPU of the cluster's largest node, whole, counted
        now or arrived (the arrival history, decayed), are worth as much as the prior
        (``ShapePrior.pods``, at least one pod; True before ``set_prior`` is called, and on a
        cluster without GPUs): until then the evidence that such pods will come is no stronger
        than the prior's, and one whole-node pod seen among a thousand notebooks does not make
        the notebooks' spread over empty nodes harmless (decision 0022). The arrivals count too:
        such a pod that arrived and fitted nowhere, or left, was evidence all the same. Kept
        until the counts or the node sizes change: ``cluster_terms`` asks on every evaluation."""
        if self._whole_node_seen is None:
            big = self._largest_node
            view = self._view()
            held = sum(c for (k, share, _, _), c in view.demand.items()
                       if k >= big and share >= MILLI_PER_GPU) / view.unit
            arrived = self.history.whole_arrived(big)
            self._whole_node_seen = big == 0 or max(held, arrived) >= max(1, self._prior.pods)
        return self._whole_node_seen

    def share_by_gpu_count(self) -> dict[int, int]:
        """GPU share of every counted pod and pseudo-pod by GPUs per pod, milli-GPU times
        count units (all types, not only the ``max_types`` most frequent: a few 8-GPU pods
        are rare as types and large as demand; readers take shares of the total)."""
        out = dict(self._view().share_by_gpus)
        for (k, milli), c in self.prior_counts().items():
            out[k] = out.get(k, 0) + c * k * milli
        return out

    def task_types(self) -> TaskTypes | None:
        """The distribution (None while no GPU pod is counted and the prior adds none)."""
        if self._dirty and self._net is not None and not any(self._net.values()):
            self._dirty, self._net = False, {}  # the running counts are what they were: the same object
        if self._dirty:
            self._dirty, self._net = False, {}
            view = self._view()
            # (-count, key) tuples sort as key=(-count, key) does, without a call per item.
            ranked = sorted([(-c, key) for key, c in view.counts.items()])[: self.max_types]
            merged = {key: -c for c, key in ranked}
            demand = dict(view.demand)
            for (k, milli), c in self.prior_counts().items():
                key: TaskKey = (k, milli, 0, 0, ANY_MODEL_MASK, 0)
                merged[key] = merged.get(key, 0) + c
                demand[(k, milli, ANY_MODEL_MASK, 0)] = demand.get((k, milli, ANY_MODEL_MASK, 0), 0) + c
            if not merged:
                self._cached = None
            else:
                self._cached = self._built(sorted([(-c, key) for key, c in merged.items()]), demand)
        return self._cached

    def _built(self, items: list[tuple[int, TaskKey]], demand: dict[tuple[int, int, int, int], int]) -> TaskTypes:
        """The ``TaskTypes`` of ``items`` (``(-count, key)``, sorted) and ``demand``; the type
        arrays and the demand classes of the last one where they are the same (``TaskTypes``:
        ``scoring.drift`` then compares by identity)."""
        last = self._cached
        keys = tuple([k for _, k in items])
        count = np.array([-c for c, _ in items], dtype=np.int64)
        if last is not None and keys == self._keys:
            columns = (last.gpu_count, last.gpu_milli, last.cpu_milli, last.memory_mib, last.model_mask,
                       last.gpu_memory_mib)
        else:
            rows = np.array(keys, dtype=np.int64)
            columns = (rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3],
                       rows[:, 4] if (rows[:, 4] != ANY_MODEL_MASK).any() else None,
                       rows[:, 5] if (rows[:, 5] != 0).any() else None)
            self._keys = keys
        classes = sorted(demand)
        demand_keys = (last.demand_keys if last is not None and last.demand_keys is not None
                       and tuple(classes) == last.demand_keys else tuple(classes))
        demand_count = np.array([demand[c] for c in classes], dtype=np.int64)
        demand_rows = tuple([(k, r, m, g, n) for (k, r, m, g), n in zip(classes, demand_count.tolist(), strict=True)])
        gpu_count, gpu_milli, cpu_milli, memory_mib, masks, gpu_mem = columns
        return TaskTypes(gpu_count, gpu_milli, cpu_milli, memory_mib, count / count.sum(), count, masks, gpu_mem,
                         demand_rows, demand_keys, demand_count)

    # -- copies --------------------------------------------------------------------------------

    def copy(self) -> WorkloadModel:
        """An independent copy (the prior, the learning and the arrival history included)."""
        out = WorkloadModel(self.max_types)
        out._counts = dict(self._counts)
        out._share_by_gpus = dict(self._share_by_gpus)
        out._demand = dict(self._demand)
        out._observed = self._observed
        out._pending = dict(self._pending)
        out._prior, out._prior_shapes = self._prior, self._prior_shapes
        out._largest_node = self._largest_node
        out.carry_history(self)
        out._dirty = True
        return out

    def carry_history(self, old: WorkloadModel, mask_of: Callable[[int], int] | None = None) -> None:
        """Take ``old``'s learning and arrival history (a state rebuilt on a node change keeps
        what arrived and left before it); ``mask_of`` maps an old model mask to this state's
        (model ids are positions in a state's model list)."""
        self._learning = old._learning
        self.history = old.history.copy(mask_of)
        self._changed(running=True)


_K = TypeVar("_K", bound=Hashable)


def _bump(counts: dict[_K, int], key: _K, delta: int) -> None:
    """Add ``delta`` to ``counts[key]``; a key whose total is no longer positive is dropped."""
    n = counts.get(key, 0) + delta
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)
