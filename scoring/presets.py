"""Named weight presets: the shipped default and baselines for comparison.

``default`` was chosen on the openb default trace (pure-core replay, seeds 43-47, see
``benchmarks/README.md``): best-fit on the GPU, packing on the node, and resource balance
so that CPU does not run out before the GPUs it serves. ``memory_headroom`` is off: even at
weight 0.1 it pulled fractional pods onto emptier GPUs and left 14% of GPUs unallocated
instead of 5.3% (seed 42, original pods only).
"""

from __future__ import annotations

from types import MappingProxyType

from scoring.strategies import ScoringConfig

PRESETS: MappingProxyType[str, ScoringConfig] = MappingProxyType({
    "default": ScoringConfig({
        "gpu_best_fit": 2.0,
        "node_packing": 1.0,
        "resource_balance": 4.0,
        "qos_interference": 0.5,
    }),
    "random": ScoringConfig({"random": 1.0}),
    "bestfit": ScoringConfig({"gpu_best_fit": 1.0, "node_packing": 1.0}),
    "packing": ScoringConfig({"node_packing": 1.0}),
    "spread": ScoringConfig({"spread": 1.0}),
    "fgd": ScoringConfig({"fgd": 1.0}),
})
"""Preset name -> ScoringConfig."""
