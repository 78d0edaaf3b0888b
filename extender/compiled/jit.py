"""How this package compiles: numba, each kernel at import, kept on disk where numba can.

Typed wrappers over numba's untyped decorators (so that the kernels' callers stay checked),
and whether numba can keep compiled kernels beside their source, in ``NUMBA_CACHE_DIR`` or
in the user's cache directory (``CACHE``): where it can, a process after the first loads
them in well under a second; an image's read-only root file system has no such place, and
every start compiles them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

_F = TypeVar("_F", bound=Callable[..., Any])


def _probe() -> None:
    """What ``can_cache`` decorates: a function of this package's directory."""


def can_cache() -> bool:
    """Whether numba can keep this package's compiled kernels on disk (module notes)."""
    try:
        numba.njit(cache=True)(_probe)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return False
    return True


CACHE = can_cache()
"""``can_cache()`` when this module was imported: what every kernel here is compiled with."""


def inline(f: _F) -> _F:
    """A helper compiled into each kernel that calls it."""
    return cast(_F, numba.njit(inline="always")(f))


def kernel(signature: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A kernel of one signature (numba's types), compiled when its module is imported; it
    releases the GIL, and refuses arrays of other types with ``TypeError`` instead of
    compiling again."""
    return lambda f: cast(Callable[..., None], numba.njit(signature, nogil=True, cache=CACHE)(f))
