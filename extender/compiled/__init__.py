"""Compiled scoring: feasibility and score functions, in place of the numpy reference's.

``scoring`` is the reference: pure numpy, every strategy's formula and its source. A module
here computes the same numbers to the bit in one compiled pass over the candidate rows
(numba, the ``compiled`` extra), where numpy's fixed cost per call is most of a one-row
rescoring (decision record 0032): ``compiled_fit`` for ``scoring.fit.fit``, and a strategy's
``gpu_score`` and ``node_score`` registered under the strategy's own name (``COMPILED``).
``kernels()`` bundles them for ``scoring.build_scorer``; without numba it bundles the
reference itself, and every placement is the same either way (the modules' tests hold
them to the reference).

Compiling takes a few seconds, once per process (less where numba can keep the result on
disk, ``extender.compiled.jit``): ``kernels()`` compiles them when first called, which the
extender does in a thread as it starts, scoring with the reference until they are ready;
never on a request.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from scoring.fit import fit
from scoring.registry import STRATEGIES, Strategy
from scoring.scorer import CombineFn, FitFn, Scorer, ScoringConfig, build_scorer

log = logging.getLogger(__name__)

COMPILED: Mapping[str, str] = MappingProxyType({
    name: f"extender.compiled.compiled_{name}" for name in ("adaptive_balance", "fgd", "spare_nodes")})
"""Strategy name -> the module here that compiles its ``gpu_score`` and ``node_score`` (the
ones it defines replace the reference's)."""

FEASIBILITY = "extender.compiled.compiled_fit"
"""The module here whose ``fit`` replaces ``scoring.fit.fit``."""

COMBINATION = "extender.compiled.compiled_plan"
"""The module here whose ``combine`` combines the weighted strategies (``scoring.scorer.CombineFn``)."""


@dataclass(frozen=True, slots=True)
class Kernels:
    """What ``scoring.build_scorer`` scores with (its ``strategies``, ``feasibility`` and ``combination``).

    Attributes
    ----------
    strategies : mapping of str to Strategy
        Every registered name; the compiled score functions of ``COMPILED`` swapped in.
    feasibility : callable
        ``scoring.fit.fit``'s signature.
    backend : str
        ``numba <version>``, or ``numpy`` for the reference alone (the start-up log says which).
    combination : callable or None
        ``scoring.scorer.CombineFn`` (``compiled_plan.combine``); None: the scorer's own.
    """

    strategies: Mapping[str, Strategy]
    feasibility: FitFn
    backend: str
    combination: CombineFn | None = None

    def scorer(self, config: ScoringConfig) -> Scorer:
        """``scoring.build_scorer(config)`` scoring with these kernels."""
        return build_scorer(config, self.strategies, self.feasibility, self.combination)

    def swap_into(self, scorer: Scorer) -> None:
        """``Scorer.use`` with these kernels: the same numbers, swapped in place."""
        scorer.use(self.strategies, self.feasibility, self.combination)


REFERENCE = Kernels(STRATEGIES, fit, "numpy")
"""The numpy reference alone."""


def kernels() -> Kernels:
    """The compiled kernels, or ``REFERENCE`` when numba is not installed, or does not load or
    compile here (a warning says why: the placements are the same, only slower).

    Returns
    -------
    Kernels
    """
    if importlib.util.find_spec("numba") is None:
        return REFERENCE
    try:
        modules = {name: importlib.import_module(path) for name, path in COMPILED.items()}  # numba compiles here
        feasibility = importlib.import_module(FEASIBILITY).fit
        combination = importlib.import_module(COMBINATION).combine
        import numba
    except Exception as exc:  # noqa: BLE001 - numba's errors on an unsupported numpy or CPU vary
        log.warning("compiled scoring kernels unavailable, scoring with numpy: %s", exc)
        return REFERENCE
    registry = dict(STRATEGIES)
    for name, module in modules.items():
        registry[name] = dataclasses.replace(STRATEGIES[name], **{
            f: getattr(module, f) for f in ("gpu_score", "node_score") if hasattr(module, f)})
    return Kernels(MappingProxyType(registry), feasibility, f"numba {numba.__version__}", combination)
