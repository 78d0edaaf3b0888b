"""Named weight presets: the shipped default and baselines for comparison.

``default`` is FGD with a light, adaptive resource-balance term, gap price and priced
stranding (``fgd`` 1, ``adaptive_balance`` 0.2, ``gap_price`` 6, ``priced_stranding`` 6),
for the shipped profile where every pod of the gpufrac scheduler, CPU-only ones included,
reaches the extender (``scheduler-config.yaml``). It
was chosen on the openb trace with ``gpufrac replay --in-process`` (seed 42, unallocated
GPU % at 100 % arrived; ``benchmarks/README.md``). First FGD and a fixed balance:

==============================================  =======  ======  ==========  ===========
weights (every pod through the extender)        default  cpu250  multigpu50  gpushare100
==============================================  =======  ======  ==========  ===========
``fgd`` alone                                   4.87     9.56    2.75        13.52
``fgd`` + ``resource_balance`` 0.1              4.26     6.87    2.92        13.35
``fgd`` + ``resource_balance`` 0.15             4.32     6.98    2.94        13.30
``fgd`` + ``resource_balance`` 0.5              4.47     6.39    10.12       13.37
``fgd`` + ``stranding`` 0.5                     4.52     7.51    2.78        12.87
``fgd`` + ``stranding`` 1                       4.53     7.50    3.00        12.93
``fgd`` + ``stranding`` 0.5, balance 0.1        5.78     6.89    2.78
``balance``, CPU-only pods by LeastAllocated    4.62     11.83   7.41        13.52
==============================================  =======  ======  ==========  ===========

then the balance against multi-GPU demand (``fgd`` 1 plus):

===================================================  =======  ======  ==========  ==========
second term                                          default  cpu250  multigpu30  multigpu40
===================================================  =======  ======  ==========  ==========
none (``fgd`` alone)                                 4.87     9.56                3.18
``resource_balance`` 0.1 (the previous default)      4.26     6.87    3.69        3.51
``stranding`` 0.2                                    4.54     7.39    3.48        3.06
``stranding`` 0.2 + ``resource_balance`` 0.05        5.61     7.25                2.95
``adaptive_balance`` 0.2, S 0.3 (**default** base)   4.29     6.85    3.55        3.09
``adaptive_balance`` 0.2, S 0.5                      4.26     7.12    3.56        3.13
``resource_balance`` 0.1 fading to 0 at s = 0.4      4.30             4.30        3.28
===================================================  =======  ======  ==========  ==========

FGD (``scoring.fgd``) keeps whole nodes for multi-GPU pods and free shares the learned
workload can use; the balance term keeps CPU and memory from running out before the GPUs
they serve (FGD only sees that once a task type can no longer run at all). With the FGD
score in 1/100 steps the balance term is a tie-break plus a small pull: at weight 0.1 a
balance difference of 0.1 moves a node by one FGD step. Two-sided balance also spreads
CPU-light pods over empty nodes and breaks the 8-GPU nodes multi-GPU pods need (multigpu50:
10 % at 0.5); the one-sided ``stranding`` does not, but loses on cpu250.
``adaptive_balance`` is the first while multi-GPU pods are rare and the second once they
are 30 % of the GPU demand. The response is not monotonic in the weights (the rows mixing
two terms), so single-seed sweeps were only used to pick candidates; the shipped weights
are measured on every variant over two seeds in ``benchmarks/results/compare``.

Then ``gap_fill`` (``scoring.gap_fill``: the change in the expected waste of the gap a pod
leaves on its GPU) on top of ``fgd`` 1 and ``adaptive_balance`` 0.2, default seeds 42 and 43:

=============================================  =======  =======
``gap_fill`` weight                            seed 42  seed 43
=============================================  =======  =======
0 (the default before gap fill)                4.29     4.29
0.5 (the default until gap price)              4.20     4.18
1                                              4.27
2                                              4.17     4.23
4                                              4.22     4.17
0.5, ``P_ABUNDANT`` 0.01 (instead of 0.02)     4.25     4.27
0.5, ``P_ABUNDANT`` 0.04                       4.29     4.25
=============================================  =======  =======

At 0.5 a gap-fill difference of 0.02 (40 milli of expected waste) moves a node by one FGD
step, so it decides among FGD's near-ties and does not overturn FGD's strong preference
for filling an existing hole over opening a fresh GPU. Over seeds 42-51 it is lower than
the previous default on every seed (median 4.26 against 4.29); over every variant and two
seeds see ``benchmarks/results/compare-gap-fill``.

Then ``adaptive_balance`` doubles its two-sided term where CPU fills as fast as the GPUs
(CPU pressure 0.9 to 1; ``scoring.adaptive_balance``): cpu250 over seeds 42-51 6.77 %
against 6.95 %, default unchanged (pressure about 0.83 there, the same placements).

Last, ``gap_price`` (``scoring.gap_price``: gap fill's value function with the shadow prices
of the cutting-stock LP of the learned workload instead of a scarcity discount) replacing
``gap_fill``, default, by seed. The oracle rows used fixed prices, the LP's duals over each
seed's whole arrived demand, to see whether prices help at all; the ``gap_price`` rows
learn them online as shipped:

=====================================================  =====  =====  =====  =====  =====  =====
``gap_fill`` 0 plus                                    42     43     44     45     46     48
=====================================================  =====  =====  =====  =====  =====  =====
(``gap_fill`` 0.5, the default before)                 4.20   4.18   4.14   4.26   4.39   4.38
oracle prices in place of ``W``, weight 0.5            4.22   4.23
oracle prices, weight 2                                4.16
oracle prices, weight 3                                4.02
oracle prices, weight 4                                4.02   4.00   3.96
oracle prices, weight 8                                4.07
``gap_price`` 4 (online prices)                        4.03   4.00   3.98   3.98   4.17   4.24
``gap_price`` 5                                        3.98   4.02   3.95   3.94   4.11   4.17
``gap_price`` 6 (**default**)                          4.08   3.96   3.91   3.98   4.07   4.12
``gap_price`` 8                                                                    4.07   4.17
=====================================================  =====  =====  =====  =====  =====  =====

A regret of 40 milli is one FGD step at weight 0.5 but twelve at weight 6: with prices the
term may overturn FGD's preference for filling an existing hole, because the prices know
which holes are worth keeping for the pods that complete them. Weight 6 was chosen over 4
on the sum of the four seeds both had run (16.23 against 16.44); the oracle rows say that
learning the prices online costs nothing measurable. Over seeds 42-51, 6 gives a median of
4.03 % (mean 4.038; through HTTP, ``benchmarks/README.md``) and 5 a median of 4.00 %
(mean 4.036; in process, measured after 6 shipped, seeds 47/49/50/51: 4.05 / 3.93 / 4.24 /
3.97): the same mean, so the difference in medians is seed noise, and the default stays
at the weight that was validated end to end.

Last, ``priced_stranding`` (``scoring.priced_stranding``: the priced gap value a node's free
CPU and memory can no longer serve, at the workload's CPU and memory per milli-GPU). At
100 % arrived on seed 42 the gap-price default still left lone 470-milli pods on GPUs
whose node had no CPU left for a partner (14 GPUs, 0.12 points) and free GPUs on nodes
with under 4 cores (0.06 points): FGD rates a pod that takes a small node's last cores
cheap, because that node already could not run the types that need more. Default seeds
47 and 51 (the two around the median of 42-51), in process:

=====================================================  =====  =====
``fgd`` 1, ``adaptive_balance`` 0.2, ``gap_price`` 6  47     51
=====================================================  =====  =====
alone (the default before)                             4.05   4.01
``priced_stranding`` 6 (**default**)                   3.82   3.85
``priced_stranding`` 3                                 3.84   3.85
first form (types shut out of each gap), weight 6      5.77   4.98
``adaptive_balance`` 0.5 instead of 0.2                3.98   4.02
``gap_price.SATURATION`` 1.05 instead of 1             4.01   4.01
``gap_price.SATURATION`` 1.1                           4.01   4.00
``gap_price.SATURATION`` 1.2                           4.23   4.22
``gap_price.SATURATION`` 0.95                          4.28   4.36
=====================================================  =====  =====

Weight 6 is ``gap_price``'s, so that a milli of stranded value costs what a milli of priced
gap does; 3 does as well (3.84 / 3.85). The first form charged, per gap, the types whose CPU
or memory the pod shuts out, a myopic count: at 100 % arrived on seed 47 it had left 74
whole GPUs free on nodes with under 4 cores. The fluid form counts a node's CPU as serving ``c / rho_cpu`` milli of GPU value whoever comes, so using
up a small node's cores is a cost only where it leaves value unserved. ``SATURATION``
above 1 changes the LP's prices at a few points only (at 1.1, 9 of 208 checkpoints, one
every 40 pods of seed 47, 6 of them in the first 6 % of arrivals), so its 0.04 on seed 47
is the seed-to-seed noise of changed early decisions; at 1.2 the LP fails every 810 and
the prices collapse; below 1 the LP leaves GPUs spare at times and then prices every pod
at its share and a GPU at 0, which prefers nothing (seed 47 at half its arrivals: the same
prices as at 1 for 0.95, that collapse for 0.9).

``balance`` is the default before FGD (``gpu_best_fit`` 4, ``resource_balance`` 4,
``multi_gpu_reserve`` 3.75, ``node_packing`` 0.2, ``qos_interference`` 0.5), tuned for a
profile that sends only GPU pods (``managedResources``) and leaves CPU-only pods to
kube-scheduler's LeastAllocated (the last row). ``qos_interference`` is not in the default:
a soft term strong enough to matter overturns FGD's steps; keep guaranteed pods away from
best-effort ones with the placement rule ``qos.isolate_guaranteed`` instead.

The baselines are the paper's (Weng et al., USENIX ATC '23): ``random``; ``bestfit``, the
published BestFit (``scoring.best_fit``: least CPU and GPU left on the node); ``fgd``
(``scoring.fgd``). They reproduce the published numbers under the authors' simulator's
scheduling (every pod through the extender, in-tree scores off:
``benchmarks/scheduler-config-simulator.yaml``).
"""

from __future__ import annotations

from types import MappingProxyType

from scoring.strategies import ScoringConfig

PRESETS: MappingProxyType[str, ScoringConfig] = MappingProxyType({
    "default": ScoringConfig({"fgd": 1.0, "adaptive_balance": 0.2, "gap_price": 6.0, "priced_stranding": 6.0}),
    "balance": ScoringConfig({
        "gpu_best_fit": 4.0,
        "node_packing": 0.2,
        "resource_balance": 4.0,
        "qos_interference": 0.5,
        "multi_gpu_reserve": 3.75,
    }),
    "random": ScoringConfig({"random": 1.0}),
    "bestfit": ScoringConfig({"best_fit": 1.0}),
    "packing": ScoringConfig({"node_packing": 1.0}),
    "spread": ScoringConfig({"spread": 1.0}),
    "fgd": ScoringConfig({"fgd": 1.0}),
})
"""Preset name -> ScoringConfig."""
