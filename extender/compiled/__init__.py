"""Compiled score functions, registered under the strategies' own names.

``scoring`` is the reference: pure numpy, every strategy's formula and its source. A module
here computes one strategy's scores to the bit in one compiled pass (numba, the ``compiled``
extra), where numpy's fixed cost per call is most of a one-row rescoring (decision record
0032). ``strategies()`` is ``scoring.STRATEGIES`` with those functions swapped in, for
``scoring.build_scorer``; without numba it is ``STRATEGIES`` itself, and every placement is
the same either way (the kernels' tests hold them to the reference).

Compiling takes a few seconds, once per process (less where numba can keep the result on
disk, ``extender.compiled.fgd``): ``strategies()`` compiles the kernels when first called,
which the extender does while it starts, before it is ready; never on a request.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
from collections.abc import Mapping
from types import MappingProxyType

from scoring.registry import STRATEGIES, Strategy

log = logging.getLogger(__name__)

COMPILED = ("fgd",)
"""The strategies with a compiled module here (``extender.compiled.<name>``)."""


def strategies() -> Mapping[str, Strategy]:
    """``STRATEGIES`` with the compiled score functions of ``COMPILED`` (read-only).

    Returns
    -------
    mapping of str to Strategy
        Every registered name; ``STRATEGIES`` itself when numba is not installed, or does
        not load or compile here (logged once per call as a warning: the scores are the
        same, only slower).
    """
    if importlib.util.find_spec("numba") is None:
        return STRATEGIES
    try:
        fgd = importlib.import_module("extender.compiled.fgd")  # numba compiles (or loads) the kernels here
    except Exception as exc:  # noqa: BLE001 - numba's errors on an unsupported numpy or CPU vary
        log.warning("compiled scoring kernels unavailable, scoring with numpy: %s", exc)
        return STRATEGIES
    out = dict(STRATEGIES)
    out["fgd"] = dataclasses.replace(STRATEGIES["fgd"], gpu_score=fgd.gpu_score, node_score=fgd.node_score)
    return MappingProxyType(out)


def backend(registry: Mapping[str, Strategy]) -> str:
    """What scores ``COMPILED`` in ``registry`` (one ``strategies()`` returned), for the
    start-up log: ``numba <version>`` or ``numpy``."""
    if registry is STRATEGIES:
        return "numpy"
    import numba

    return f"numba {numba.__version__}"
