"""The arrival history of the learned workload: GPU pods counted once as they arrive, decayed.

``scoring.workload.WorkloadModel`` counts the pods running and waiting; beside that count it
keeps an ``ArrivalHistory``: each GPU pod counted once when first seen, with a weight that
halves every ``half_life_pods`` arrivals, and the departures of pods that held GPUs, with the
same weights. The learned mix may read it (``Learning.learn_from``), the ``consolidation``
strategy reads its churn, and the keep-whole band its whole-node arrivals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scoring.request import MILLI_PER_GPU

TaskKey = tuple[int, int, int, int, int, int]
"""``(gpu_count, gpu_milli, cpu_milli, memory_mib, model_mask, gpu_memory_mib)``; the last is the
explicit GPU memory per GPU, 0 for a share's proportion."""


LEARN_FROM = ("running", "arrivals")
"""What the learned workload counts (``Learning.learn_from``)."""

HALF_LIFE_PODS = 4096
"""The shipped half-life of the arrival history, in GPU pods arrived (``Learning``)."""

MAX_HALF_LIFE_PODS = 1 << 20
"""Largest half-life a config may set."""

ARRIVAL_UNITS = 64
"""``TaskTypes.count`` units per pod in the arrival mix: a type's decayed count is rounded to
1/64 pod (FGD's sums stay exact integers; a type whose weight decayed below 1/64 pod drops)."""

_REBASE_HALF_LIVES = 64
"""Half-lives after which the arrival weights are rescaled (``WorkloadModel``'s notes)."""


@dataclass(frozen=True, slots=True)
class Learning:
    """What the learned workload counts, and how long it remembers.

    Parameters
    ----------
    learn_from : {"running", "arrivals"}
        ``running``: the GPU pods placed and waiting now (each counted while it runs or
        waits); ``arrivals``: the GPU pods as they arrive, each counted once when first
        seen, with a weight halving every ``half_life_pods`` arrivals, plus the pods waiting
        (each as one fresh arrival while it waits).
    half_life_pods : int
        Half-life of the arrival history, in GPU pods arrived, >= 1. It also sets how fast
        ``WorkloadModel.churn`` follows the pods leaving, whatever ``learn_from``.

    Notes
    -----
    Where pods leave, the pods running over-represent the long-lived ones (a pod that lives
    ten times longer is counted ten times as often: survivorship); the arrivals count each
    pod once. On the churn replay the two differ most for multi-GPU pods, which live about
    twice as long as the others in openb (``docs/decisions/0022-churn-default.md``). The
    half-life is counted in arrivals, not seconds: no clock is read (another machine's
    timestamps are not trusted), a quiet cluster forgets nothing, and the same pod events
    give the same weights on every replica.
    """

    learn_from: str = "running"
    half_life_pods: int = HALF_LIFE_PODS

    def __post_init__(self) -> None:
        if self.learn_from not in LEARN_FROM:
            raise ValueError(f"learn_from: must be one of {', '.join(LEARN_FROM)}, got {self.learn_from!r}")
        if (isinstance(self.half_life_pods, bool) or not isinstance(self.half_life_pods, int)
                or not 1 <= self.half_life_pods <= MAX_HALF_LIFE_PODS):
            raise ValueError(f"half_life_pods: must be an integer in 1..{MAX_HALF_LIFE_PODS}, "
                             f"got {self.half_life_pods!r}")


RUNNING = Learning()
"""Learn from the pods placed and waiting (the paper baselines, and the default's until 0022)."""


class ArrivalHistory:
    """Arrivals and departures of GPU pods, decayed by arrivals (``WorkloadModel``'s notes).

    Parameters
    ----------
    half_life_pods : int
        Arrivals after which a weight halves (``Learning.half_life_pods``).

    Notes
    -----
    Arrival ``n`` weighs ``2 ** ((n - base) / h)``; every ``_REBASE_HALF_LIVES`` half-lives
    the weights are divided by the current one and ``base`` moves to the current arrival (the
    floats stay far from overflow), and types below ``1 / ARRIVAL_UNITS`` pod are dropped. The
    same arrivals and departures, in the same order, give the same weights to the bit.
    """

    def __init__(self, half_life_pods: int = HALF_LIFE_PODS) -> None:
        self.half_life_pods = half_life_pods
        self.arrivals = 0
        self._base = 0
        self._arrived_w = 0.0
        self._departed_w = 0.0
        self.by_key: dict[TaskKey, float] = {}
        """Arrival weight per task type (relative: divide by ``weight_now``)."""
        self._whole_w: dict[int, float] = {}  # whole-GPU pods by GPUs per pod

    def weight_now(self) -> float:
        """The weight of an arrival now (the unit the others are read against)."""
        return float(2.0 ** ((self.arrivals - self._base) / self.half_life_pods))

    def arrive(self, key: TaskKey) -> None:
        """A GPU pod of type ``key`` seen for the first time."""
        self.arrivals += 1
        w = self.weight_now()
        self._arrived_w += w
        self.by_key[key] = self.by_key.get(key, 0.0) + w
        if key[1] >= MILLI_PER_GPU:
            self._whole_w[key[0]] = self._whole_w.get(key[0], 0.0) + w
        if self.arrivals - self._base >= _REBASE_HALF_LIVES * self.half_life_pods:
            self.rebase()

    def depart(self) -> None:
        """A pod that held GPUs has left (deleted or finished)."""
        self._departed_w += self.weight_now()

    def churn(self) -> float:
        """Departures over arrivals, both decayed, in [0, 1]: 0 while no pod that held GPUs has
        left (an arrivals-only cluster), near 1 where pods leave as fast as they arrive (the lag
        of their lifetimes keeps it below: ``2 ** (-pods running / half_life_pods)``)."""
        if self._arrived_w <= 0.0:
            return 0.0
        return min(1.0, self._departed_w / self._arrived_w)

    def whole_arrived(self, min_gpus: int) -> float:
        """Whole-GPU pods of at least ``min_gpus`` GPUs arrived, decayed, in pods to 1/``ARRIVAL_UNITS``."""
        w = sum(x for k, x in self._whole_w.items() if k >= min_gpus)
        return round(w / self.weight_now() * ARRIVAL_UNITS) / ARRIVAL_UNITS

    def rebase(self) -> None:
        """Weights relative to the current arrival; negligible types dropped (class notes)."""
        f = 1.0 / self.weight_now()
        self._arrived_w *= f
        self._departed_w *= f
        least = 1.0 / ARRIVAL_UNITS
        self.by_key = {key: w * f for key, w in self.by_key.items() if w * f >= least}
        self._whole_w = {k: w * f for k, w in self._whole_w.items()}
        self._base = self.arrivals

    def set_half_life(self, half_life_pods: int) -> None:
        """A new half-life from now on (the weights so far are kept relative to now)."""
        if half_life_pods != self.half_life_pods:
            self.rebase()
            self.half_life_pods = half_life_pods

    def copy(self, mask_of: Callable[[int], int] | None = None) -> ArrivalHistory:
        """An independent copy; ``mask_of`` maps each type's model mask (a state rebuilt with
        other model ids: ``ClusterState.model_mask_from``)."""
        out = ArrivalHistory(self.half_life_pods)
        out.arrivals, out._base = self.arrivals, self._base
        out._arrived_w, out._departed_w = self._arrived_w, self._departed_w
        out._whole_w = dict(self._whole_w)
        if mask_of is None:
            out.by_key = dict(self.by_key)
        else:
            for key, w in self.by_key.items():
                new = (*key[:4], mask_of(key[4]), key[5])
                out.by_key[new] = out.by_key.get(new, 0.0) + w
        return out
