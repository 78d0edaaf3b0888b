"""``ShapePrior``: pseudo-pods of the shapes a cluster's nodes can host, added to the learned workload.

A fresh cluster has seen few shapes: after a thousand quarter-GPU notebooks the learned
workload (``scoring.workload.WorkloadModel``) is "quarter GPUs only", against which no
placement fragments anything, and the notebooks spread over every node until the first
8-GPU job fits nowhere (issue 36). So the counts start from a prior: pseudo-pods of the
shapes the cluster's nodes can host (a whole node and half a node of every node size, a
whole GPU, half and a quarter of one), which real demand outgrows but never erases
(``ShapePrior``'s notes; decision record 0011).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scoring.request import MILLI_PER_GPU

PRIOR_PODS = 8
"""Pseudo-pods the default prior is worth while little is observed (see ``ShapePrior``)."""

PRIOR_FLOOR = 0.05
"""The default prior's share of the counted pods for the shapes not seen yet, however many
pods are observed."""

PRIOR_FRACTIONS_MILLI = (500, 250)
"""Shares of one GPU the automatic prior expects besides whole GPUs."""


@dataclass(frozen=True, slots=True)
class ShapePrior:
    """Pseudo-pods added to the learned workload, so that shapes not seen yet still count.

    Parameters
    ----------
    shapes : tuple of (int, int, int)
        ``(gpu_count, gpu_milli, weight)``: GPUs per pod (>= 1), share per GPU in milli-GPU
        (1..1000; 1000 for whole GPUs) and a relative weight (>= 1). Empty: the automatic
        prior, resolved against the cluster's node sizes by ``resolve``.
    pods : int
        Pseudo-pods the prior is worth while the observed pods are few, >= 0.
    floor : float
        Share, in [0, 0.5], of the counted pods that the shapes not seen yet hold together,
        however many pods are observed.

    Notes
    -----
    With ``N`` observed GPU pods (placed and pending) the prior counts
    ``T = max(pods, ceil(floor * N))`` pseudo-pods. A shape no counted pod holds yet gets
    ``max(1, round(T * w_i / sum w))`` of them; a shape counted pods already hold keeps one
    (``counts``; a whole-GPU shape is held by pods of the same GPU count, the fractional
    shapes by any fractional pod). With the defaults (8 pods, floor 5 %) and five shapes, a
    cluster that has seen 960 quarter-GPU notebooks counts ``T = 48``, 10 pseudo-pods for
    each of the whole GPU, 4 and 8 GPUs. Why these numbers:

    - A pseudo-pod is a pod, not a GPU: FGD weighs task types by pod count (popularity), so
      8-GPU pseudo-pods at about 1 % of the pods make a placement that breaks an empty node
      score 4-5 of FGD's 1/100 steps below one that fills a used one (the break makes the
      node's whole free share fragment for the 8-GPU type), more than the balance term's
      preference for the empty node. At 2 pseudo-pods per shape (floor 1 %) it was one step,
      and 960 notebooks still touched 134 of 500 nodes (``docs/decisions/0011-shape-prior.md``).
    - Only unseen shapes get the floor: added to every shape, 5 % moved openb default from
      3.77 % to 3.81 % unallocated (seeds 42-51, in process); openb holds every shape early,
      so there the prior is one pseudo-pod per shape and the median moved by 0.01 point.
    - A shape that does arrive is counted as the pods it brings, plus one pseudo-pod.

    The pseudo-pods ask for no CPU and no host memory and accept any GPU model: the prior
    says which GPU shapes will come, not what they bring with them.
    """

    shapes: tuple[tuple[int, int, int], ...] = ()
    pods: int = PRIOR_PODS
    floor: float = PRIOR_FLOOR

    def __post_init__(self) -> None:
        if isinstance(self.pods, bool) or not isinstance(self.pods, int) or self.pods < 0:
            raise ValueError(f"pods: must be an integer >= 0, got {self.pods!r}")
        if not 0.0 <= self.floor <= 0.5:
            raise ValueError(f"floor: must be in [0, 0.5], got {self.floor!r}")
        for i, (k, milli, w) in enumerate(self.shapes):
            if not 1 <= k <= MAX_PRIOR_GPUS or not 1 <= milli <= MILLI_PER_GPU or not 1 <= w <= MAX_PRIOR_WEIGHT:
                raise ValueError(f"shapes[{i}]: gpus in 1..{MAX_PRIOR_GPUS}, gpu_milli in 1..{MILLI_PER_GPU} "
                                 f"and weight in 1..{MAX_PRIOR_WEIGHT}, got {(k, milli, w)!r}")
            if k > 1 and milli != MILLI_PER_GPU:
                raise ValueError(f"shapes[{i}]: a pod of {k} GPUs takes whole GPUs (gpu_milli 1000), "
                                 f"got {milli}")

    @property
    def off(self) -> bool:
        """Whether the prior adds nothing."""
        return self.pods == 0 and self.floor == 0.0

    def resolve(self, node_sizes: Iterable[int]) -> tuple[tuple[int, int, int], ...]:
        """The shapes, with the automatic prior resolved against the node sizes.

        Parameters
        ----------
        node_sizes : iterable of int
            GPUs per node of the cluster's GPU nodes (repeats allowed).

        Returns
        -------
        tuple of (int, int, int)
            ``(gpu_count, gpu_milli, weight)``, sorted; empty when the prior is off, or
            automatic on a cluster without GPUs. The automatic prior holds, with weight 1
            each: ``c`` and ``c // 2`` whole GPUs for every node size ``c``, one whole GPU,
            and ``PRIOR_FRACTIONS_MILLI`` of one.
        """
        if self.off:
            return ()
        if self.shapes:
            return tuple(sorted(self.shapes))
        sizes = {min(int(c), MAX_PRIOR_GPUS) for c in node_sizes if c > 0}
        if not sizes:
            return ()
        whole = {c for s in sizes for c in (s, s // 2) if c >= 1} | {1}
        return tuple(sorted([(k, MILLI_PER_GPU, 1) for k in whole]
                            + [(1, f, 1) for f in PRIOR_FRACTIONS_MILLI]))

    def counts(self, shapes: tuple[tuple[int, int, int], ...], observed: int,
               seen: tuple[bool, ...] | None = None) -> list[int]:
        """Pseudo-pods of each of ``shapes`` (``resolve``) after ``observed`` counted pods.

        ``seen``: per shape, whether counted pods already hold its class (``WorkloadModel``);
        a seen shape keeps one pseudo-pod, an unseen one its weight's part of the total.
        """
        if not shapes:
            return []
        total = max(self.pods, math.ceil(self.floor * observed))
        weight = sum(w for _, _, w in shapes)
        seen = seen if seen is not None else (False,) * len(shapes)
        return [1 if was_seen else max(1, round(total * w / weight))
                for (_, _, w), was_seen in zip(shapes, seen, strict=True)]


MAX_PRIOR_GPUS = 64
"""Largest GPUs per pod a prior shape may have (bounds what a config can size)."""

MAX_PRIOR_WEIGHT = 1000
"""Largest relative weight of a prior shape."""

NO_PRIOR = ShapePrior((), 0, 0.0)
"""Learn from observed pods only (the paper baselines)."""
