"""``Memo``: what scoring keeps from one evaluation to the next, in one object with an owner.

Scores are pure functions of the state, the request and the cluster-wide terms; some are
costly to compute from scratch (the gap prices' LP, FGD's per-row counts, the spare-node
probabilities), and what they computed for the previous evaluation usually still holds. That
memory lives here, not in module globals: ``scoring.incremental.IncrementalScorer`` owns one
``Memo`` and hands it to every evaluation it runs (``FitContext.memo``); an evaluation
without an owner gets a fresh one (same answers, computed afresh). Each user keeps one slot,
under its own name (a strategy's ``NAME``; ``gaps`` for the shared gap values), of a type it
defines; no other module reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

_T = TypeVar("_T")


class Memo:
    """Named slots of per-owner state between evaluations. Thread-safe creation; each slot's
    object guards its own contents."""

    __slots__ = ("_lock", "_slots")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, Any] = {}

    def slot(self, name: str, factory: Callable[[], _T]) -> _T:
        """The object kept under ``name``, made by ``factory`` on first use.

        Parameters
        ----------
        name : str
            The user's own name (a strategy's ``NAME``, or its module's).
        factory : callable
            Makes the empty slot object; always the same type for one name.

        Returns
        -------
        object
            The slot object (what ``factory`` returned the first time).
        """
        got = self._slots.get(name)
        if got is None:
            with self._lock:
                got = self._slots.get(name)
                if got is None:
                    got = self._slots[name] = factory()
        return cast(_T, got)
