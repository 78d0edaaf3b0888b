"""The scoring strategies: one module per term, each with its formula and source.

A strategy module defines ``NAME`` (the name admins use in the config) and ``gpu_score(ctx)``
(a per-GPU score; the node's score is its mean over the GPUs chosen there),
``node_score(ctx, chosen)`` (a node property), or both (``gpu_score`` chooses the GPUs,
``node_score`` scores the node with them); the unused one is ``None``. Every score is a
float64 in [0, 1], higher is better, 0 where the pod does not fit. A module with both may set
``ONE_GPU_NODE_SCORE_IS_GPU_SCORE = True`` when its per-GPU score is, by construction, the node
score with the pod on that GPU alone. Both functions read the ``FitContext`` of the candidate
rows and nothing else, so a row's terms depend on that row's state alone; what a strategy
keeps between evaluations to compute faster (never to answer differently, except where its
notes say so) is in ``ctx.memo`` under its ``NAME`` (``scoring.memo``), never in a module global.
A strategy whose scores read which row they score (``ctx.rows``), not only what the row
holds, sets ``READS_ROW = True`` (``random_fit``); for every other, rows of equal content
score the same (``scoring.row_contents``).

A strategy that reads a cluster-wide quantity declares it as its own term: ``TERM`` (its
name, also the key of its bound in ``scoring.drift.Tolerance`` and the admin config's
``scoring.tolerance``), ``cluster_term(state, memo)`` (computed once per evaluation; the
strategy reads it as ``ctx.terms[TERM]``), ``term_drift(frozen, now)`` (how far it moved;
past the tolerance every kept row is scored anew) and ``TERM_TOLERANCE`` (the shipped
bound). ``adaptive_balance`` (``cpu_pressure``), ``spare_nodes`` (``spare_need``) and
``consolidation`` (``churn``) do; the kernel (``scoring.fit``) knows the learned workload only.
A strategy with a term may also define ``weight_gain(terms)``, a factor in [0, 1] on its
configured weight read from the terms (``consolidation``: the churn); at 0 the scorer leaves
the strategy out, its weight too, so the others score exactly as without it.

Strategies do not import each other (an import-linter independence contract): a formula two
of them use is in ``scoring.utilization`` or ``scoring.gaps``.

``modules()`` finds every module of this package, so a new strategy is one file here (and its
test); ``scoring.scorer`` registers them and validates each once, at import.

The default preset's terms (``scoring.presets``):

- ``fgd``: FGD's fragmentation increase against the learned workload; picks the GPUs too;
- ``adaptive_balance``: resource balance, two-sided or one-sided by multi-GPU demand;
- ``gap_price``: the priced waste of the GPU's gap (cutting-stock shadow prices);
- ``priced_stranding``: the gap value a node's free CPU and memory can no longer serve;
- ``spare_nodes``: the multi-GPU pods expected to fail when a node stops having ``k`` free GPUs;
- ``consolidation``: where pods leave, the least room left on the node (best fit), so nodes
  drain whole; weighed by the churn, off where pods never leave.

The paper's baselines (Weng et al., USENIX ATC '23): ``random_fit``, ``best_fit`` and ``fgd``.

Other terms, of the ``balance`` preset and for admins to weigh: ``gpu_best_fit``,
``resource_balance``, ``stranding``, ``node_packing``, ``multi_gpu_reserve``,
``qos_interference``, ``spread``.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def modules() -> list[ModuleType]:
    """Every strategy module of this package, by module name."""
    return [importlib.import_module(f"{__name__}.{info.name}")
            for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)
            if not info.name.startswith("_")]
