"""Named weight presets: the shipped default and baselines for comparison.

``default`` was chosen on the openb default trace with ``gpufrac replay --in-process``
(the extender's own decisions without HTTP; weight sweep in ``benchmarks/README.md``):
best-fit on the GPU, and resource balance so that CPU and memory do not run out before the
GPUs they serve. Node packing is kept small: at weight 1 it drew fractional pods onto
nodes whose CPU was already spent and stranded their remaining GPUs (seeds 42-43,
unallocated at 100% arrived: node_packing 1 -> 5.19 %, 0.2 -> 4.68 %, 0 -> 4.50 %, 3 ->
9.02 %), but at 0 resource balance alone spread the first pods over every CPU-rich 8-GPU
node and an 8-GPU, 120-core pod found no free node at 7 % load (seed 42, pod 6602).
``multi_gpu_reserve`` adds packing in proportion to the squared multi-GPU share of the
demand: it costs 0.1 point on default (4.57 -> 4.67 %, seeds 42-43) and gives back 11.6 on
multigpu40 (17.83 -> 6.24 %). ``memory_headroom`` is off: even at weight 0.1 it pulled fractional
pods onto emptier GPUs and left 14% of GPUs unallocated instead of 5.3% (seed 42).

The baselines are the paper's (Weng et al., USENIX ATC '23): ``random``; ``bestfit``, the
published BestFit (``scoring.best_fit``: least CPU and GPU left on the node); ``fgd``
(``scoring.fgd``). They reproduce the published numbers under the authors' simulator's
scheduling (every pod through the extender: ``benchmarks/scheduler-config-simulator.yaml``).
"""

from __future__ import annotations

from types import MappingProxyType

from scoring.strategies import ScoringConfig

PRESETS: MappingProxyType[str, ScoringConfig] = MappingProxyType({
    "default": ScoringConfig({
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
