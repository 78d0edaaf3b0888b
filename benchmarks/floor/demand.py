"""The GPU demand the floors bound: the openb pods that have arrived when GPU demand reaches
100 % of capacity, grouped by share (and by the GPU models they accept).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchmarks import trace

MILLI_PER_GPU = 1000


Accepts = frozenset[str]
"""GPU models a class of pods accepts (by name)."""


@dataclass(frozen=True, slots=True)
class ArrivedGpuDemand:
    """The GPU pods of one arrival sequence up to the 100 % point, any model accepted.

    Attributes
    ----------
    fractional : dict of int to int
        Pods of one GPU below 1000 milli: share (milli) -> number of pods.
    whole : dict of int to int
        Whole-GPU pods: GPUs per pod -> number of pods.
    """

    fractional: dict[int, int]
    whole: dict[int, int]

    @property
    def milli(self) -> int:
        """Total GPU share asked for."""
        return (sum(r * n for r, n in self.fractional.items())
                + sum(MILLI_PER_GPU * k * n for k, n in self.whole.items()))


@dataclass(frozen=True, slots=True)
class ModelGpuDemand:
    """The GPU pods of one arrival sequence up to the 100 % point, by the models they accept.

    Attributes
    ----------
    fractional : dict of (int, frozenset of str) to int
        Pods of one GPU below 1000 milli: (share milli, accepted models) -> number of pods.
    whole : dict of (int, frozenset of str) to int
        Whole-GPU pods: (GPUs per pod, accepted models) -> number of pods.
    """

    fractional: dict[tuple[int, Accepts], int]
    whole: dict[tuple[int, Accepts], int]

    def any_model(self, models: Sequence[str]) -> ArrivedGpuDemand | None:
        """The same demand without models, if every class accepts every one of ``models``."""
        every = frozenset(models)
        if any(a != every for _, a in (*self.fractional, *self.whole)):
            return None
        frac: Counter[int] = Counter()
        whole: Counter[int] = Counter()
        for (r, _), n in self.fractional.items():
            frac[r] += n
        for (k, _), n in self.whole.items():
            whole[k] += n
        return ArrivedGpuDemand(dict(frac), dict(whole))


def arrived_demand(seq: Sequence[trace.TracePod], capacity_milli: int) -> ArrivedGpuDemand:
    """GPU pods in arrival order up to and including the one that brings the demand to
    ``capacity_milli`` (the replay's 100 % mark is taken right after that pod); models ignored."""
    frac: Counter[int] = Counter()
    whole: Counter[int] = Counter()
    for p in arrived_gpu_pods(seq, capacity_milli):
        if p.gpu_milli < MILLI_PER_GPU:
            frac[p.gpu_milli] += 1
        else:
            whole[p.num_gpu] += 1
    return ArrivedGpuDemand(dict(frac), dict(whole))


def arrived_model_demand(seq: Sequence[trace.TracePod], capacity_milli: int,
                         kinds: Mapping[str, tuple[str, int]]) -> ModelGpuDemand:
    """``arrived_demand`` by the GPU kinds each pod may use.

    Parameters
    ----------
    seq : sequence of TracePod
    capacity_milli : int
    kinds : mapping of str to (str, int)
        Bin name -> (GPU model, GPUs of the node). A pod may use a kind whose model its
        ``gpu_spec`` (``|``-separated) names, any model without one, and whose nodes hold
        its ``num_gpu`` (a pod of ``k`` GPUs runs on one node).
    """
    frac: Counter[tuple[int, Accepts]] = Counter()
    whole: Counter[tuple[int, Accepts]] = Counter()
    for p in arrived_gpu_pods(seq, capacity_milli):
        spec = set(p.gpu_spec.split("|")) if p.gpu_spec else None
        accepts = frozenset(b for b, (m, n) in kinds.items() if (spec is None or m in spec) and n >= p.num_gpu)
        if p.gpu_milli < MILLI_PER_GPU:
            frac[(p.gpu_milli, accepts)] += 1
        else:
            whole[(p.num_gpu, accepts)] += 1
    return ModelGpuDemand(dict(frac), dict(whole))


def arrived_gpu_pods(seq: Sequence[trace.TracePod], capacity_milli: int) -> list[trace.TracePod]:
    """The GPU pods of ``seq``, in order, up to and including the one that brings the GPU share
    asked to ``capacity_milli`` (milli-GPU)."""
    out = []
    arrived = 0
    for p in seq:
        if not p.num_gpu:
            continue
        out.append(p)
        arrived += p.gpu_request_milli
        if arrived >= capacity_milli:
            break
    return out
