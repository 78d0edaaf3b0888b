"""Objects from the API that gpufrac could not read: skipped, logged once, counted, listed.

Any namespace can create a pod that gpufrac's watch sees. One that does not parse (an
annotation out of range, a quantity no machine has, a wrong JSON type) must cost nobody
else anything: the watch skips it and goes on, readiness is not held back, and the object
is remembered here until it is fixed or deleted. ``gpufrac_rejected_objects_total{kind,
reason}`` counts first sightings; ``/quarantine`` on the extender and ``gpufrac inspect``
list them.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_ENTRIES = 10_000
"""Objects remembered at most (the oldest are forgotten first); the counter keeps counting."""
MAX_REASONS = 64
"""Distinct ``reason`` label values at most; later ones are counted as ``other``."""

_BRACKETS = re.compile(r"\[[^\]]*\]")


def reason_label(message: str) -> str:
    """A bounded metric label for an error message: its field path, user text removed.

    ``containers["x"].resources.limits[gpufrac.io/gpu]: "9Ei" is too large`` becomes
    ``containers[].resources.limits[]``.
    """
    field = message.split(": ", 1)[0]
    return _BRACKETS.sub("[]", field)[:80] or "unknown"


@dataclass(frozen=True, slots=True)
class Rejected:
    """One quarantined object."""

    kind: str
    key: str
    """``namespace/name`` (pods) or the name."""
    message: str


class Quarantine:
    """Thread-safe register of rejected objects.

    Parameters
    ----------
    count : callable (kind, reason) -> None, optional
        Called once per newly rejected object or changed message (the metric).
    """

    def __init__(self, count: Callable[[str, str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], Rejected] = {}
        self._reasons: set[str] = set()
        self._count = count

    def reject(self, kind: str, key: str, message: str) -> None:
        """Record that ``kind`` ``key`` was skipped because of ``message`` (logged once)."""
        with self._lock:
            old = self._entries.get((kind, key))
            if old is not None and old.message == message:
                return
            self._entries.pop((kind, key), None)
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.pop(next(iter(self._entries)))
            self._entries[(kind, key)] = Rejected(kind, key, message)
            reason = reason_label(message)
            if reason not in self._reasons:
                if len(self._reasons) >= MAX_REASONS:
                    reason = "other"
                else:
                    self._reasons.add(reason)
        log.warning("%s %s skipped: %s", kind, key, message)
        if self._count is not None:
            self._count(kind, reason)

    def clear(self, kind: str, key: str) -> None:
        """The object was deleted or now reads fine."""
        with self._lock:
            self._entries.pop((kind, key), None)

    def retain(self, kind: str, keys: set[str]) -> None:
        """After a full list: forget the ``kind`` entries whose object was not listed (it
        was deleted while no watch ran)."""
        with self._lock:
            for k in [k for k in self._entries if k[0] == kind and k[1] not in keys]:
                del self._entries[k]

    def entries(self) -> list[Rejected]:
        """What is quarantined now, oldest first."""
        with self._lock:
            return list(self._entries.values())
