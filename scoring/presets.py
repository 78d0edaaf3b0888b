"""Named weight presets: the shipped default and baselines for comparison.

- ``default``: FGD with a light, adaptive resource balance, gap price, priced stranding and
  spare nodes, and consolidation where pods leave (its weight scaled by the churn: nothing
  where pods never leave), for the shipped profile where every pod of the gpufrac scheduler,
  CPU-only ones included, reaches the extender (``scheduler-config.yaml``);
- ``balance``: the default before FGD, tuned for a profile that sends only GPU pods
  (``managedResources``);
- ``random``, ``bestfit``, ``fgd``: the baselines of Weng et al. (USENIX ATC '23), which
  reproduce the published numbers under ``benchmarks/scheduler-config-simulator.yaml``;
- ``packing``, ``spread``: one term each.

gpufrac's own presets learn the workload from a ``ShapePrior`` (``scoring.shape_prior``) and
break ties by keeping capacity whole (``Ties.KEEP_WHOLE``); the paper baselines learn from
observed pods only and break ties by node name, as the authors' simulator does, and so
does ``spread``, whose point is to not pack.

Why each weight is what it is, with the measurements, is in ``docs/decisions/`` (one record
per decision); ``benchmarks/README.md`` has the runs behind the numbers.
"""

from __future__ import annotations

from types import MappingProxyType

from scoring.scorer import ScoringConfig, Ties
from scoring.shape_prior import NO_PRIOR

PRESETS: MappingProxyType[str, ScoringConfig] = MappingProxyType({
    "default": ScoringConfig({"fgd": 1.0, "adaptive_balance": 0.2, "gap_price": 6.0, "priced_stranding": 6.0,
                              "spare_nodes": 2.0, "consolidation": 2.0}),
    "balance": ScoringConfig({
        "gpu_best_fit": 4.0,
        "node_packing": 0.2,
        "resource_balance": 4.0,
        "qos_interference": 0.5,
        "multi_gpu_reserve": 3.75,
    }),
    "random": ScoringConfig({"random_fit": 1.0}, prior=NO_PRIOR, ties=Ties.ROW),
    "bestfit": ScoringConfig({"best_fit": 1.0}, prior=NO_PRIOR, ties=Ties.ROW),
    "packing": ScoringConfig({"node_packing": 1.0}),
    "spread": ScoringConfig({"spread": 1.0}, prior=NO_PRIOR, ties=Ties.ROW),
    "fgd": ScoringConfig({"fgd": 1.0}, prior=NO_PRIOR, ties=Ties.ROW),
})
"""Preset name -> ScoringConfig."""
