"""The strategy registry: every module of ``scoring.strategies``, checked once at import.

A strategy module keeps the contract written in ``scoring.strategies`` (``NAME``, its score
functions, optionally its cluster-wide ``TERM``); ``STRATEGIES`` maps each name to its
``Strategy``. Read-only.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from scoring import strategies
from scoring.fit import FitContext
from scoring.memo import Memo
from scoring.state import ClusterState

GpuScoreFn = Callable[[FitContext], NDArray[np.float64]]
NodeScoreFn = Callable[[FitContext, NDArray[np.bool_]], NDArray[np.float64]]
TermFn = Callable[[ClusterState, Memo], object]
DriftFn = Callable[[object, object], float]
GainFn = Callable[[Mapping[str, object]], float]


@dataclass(frozen=True, slots=True)
class Term:
    """A strategy's own cluster-wide term (``scoring.strategies``: ``TERM``, ``cluster_term``,
    ``term_drift``, ``TERM_TOLERANCE``)."""

    name: str
    compute: TermFn
    drift: DriftFn
    tolerance: float


@dataclass(frozen=True, slots=True)
class Strategy:
    """One registered scoring shape."""

    name: str
    gpu_score: GpuScoreFn | None
    node_score: NodeScoreFn | None
    one_gpu_node_score_is_gpu_score: bool = False
    """For a one-GPU pod, the node score equals the chosen GPU's per-GPU score (so the
    scorer reuses it instead of calling ``node_score``)."""
    term: Term | None = None
    """The strategy's cluster-wide term, when it declares one."""
    gain: GainFn | None = None
    """``weight_gain(terms)``: a factor in [0, 1] on the strategy's weight, read from the
    cluster-wide terms; None: the weight as configured."""
    reads_row: bool = False
    """Its scores read which row they score (``ctx.rows``), not only the row's content: rows
    of equal content may score differently (``scoring.row_contents``)."""


def _strategy(module: types.ModuleType) -> Strategy:
    """A strategy module as a ``Strategy``, checked against the contract in ``scoring.strategies``.

    Raises
    ------
    TypeError
        When the module lacks ``NAME`` or defines neither score function.
    """
    name = getattr(module, "NAME", None)
    gpu_score, node_score = getattr(module, "gpu_score", None), getattr(module, "node_score", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{module.__name__}: define NAME, the strategy's config name")
    # Both defined (fgd): gpu_score picks the GPUs, node_score scores the node with them.
    if gpu_score is None and node_score is None:
        raise TypeError(f"{module.__name__}: define gpu_score, node_score or both")
    term = None
    if hasattr(module, "TERM"):
        parts = (getattr(module, "cluster_term", None), getattr(module, "term_drift", None),
                 getattr(module, "TERM_TOLERANCE", None))
        if not isinstance(module.TERM, str) or not module.TERM or None in parts:
            raise TypeError(f"{module.__name__}: a TERM needs cluster_term, term_drift and TERM_TOLERANCE")
        term = Term(module.TERM, module.cluster_term, module.term_drift, float(module.TERM_TOLERANCE))
    gain = getattr(module, "weight_gain", None)
    if gain is not None and term is None:
        raise TypeError(f"{module.__name__}: weight_gain reads the strategy's own TERM; declare one")
    return Strategy(name, gpu_score, node_score,
                    bool(getattr(module, "ONE_GPU_NODE_SCORE_IS_GPU_SCORE", False)), term, gain,
                    bool(getattr(module, "READS_ROW", False)))


def _registry(found: list[types.ModuleType]) -> dict[str, Strategy]:
    registry: dict[str, Strategy] = {}
    terms: set[str] = set()
    for module in found:
        strategy = _strategy(module)
        if strategy.name in registry:
            raise TypeError(f"{module.__name__}: strategy name {strategy.name!r} is taken")
        if strategy.term is not None:
            if strategy.term.name in terms or strategy.term.name == "workload":
                raise TypeError(f"{module.__name__}: term name {strategy.term.name!r} is taken")
            terms.add(strategy.term.name)
        registry[strategy.name] = strategy
    return registry


STRATEGIES: Mapping[str, Strategy] = MappingProxyType(_registry(strategies.modules()))
"""Registry: strategy name -> Strategy."""
