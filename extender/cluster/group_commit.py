"""A node's group commit: fenced binds to one node sharing one claim write.

Binds to one node queue up; the first one not waiting on a write becomes the leader and,
under the node lock, assumes every queued pod against one view of the node's claim ledger
(each counting the others' holds), then writes all their claims in one compare-and-swap with
the lock released, so binds arriving meanwhile queue for the next write
(``KubeBinder._commit_group``). One write covers every bind that came while the previous one
was in flight, and the choice is the same as one bind at a time: each pod was assumed
against the ledger version the write is conditioned on. A conflict refuses the whole group
(each is retried by kube-scheduler); a pod that no longer fits is refused alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from extender.cache import BindError, PodRecord
from podspec.pods import PodIntent


@dataclass(eq=False)
class Queued:
    """One fenced bind waiting in its node's group commit."""

    uid: str
    namespace: str
    name: str
    shape: PodIntent | None = None  # what its ResourceClaims ask (GpuCache.assume)
    done: bool = False
    record: PodRecord | None = None
    error: BindError | None = None


class NodeGroup:
    """A node's group commit: binds queued for the next claim write, and whether one is
    being written (``cond`` guards both and is the node's lock for fenced binds); ``reading``
    is held around reading the node's ledger before the commit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.queue: list[Queued] = []
        self.writing = False
        self.reading = threading.Lock()

    def join(self, me: Queued, commit: Callable[[list[Queued]], None]) -> PodRecord:
        """Queue ``me`` and wait until a group commit has decided it; the leader runs
        ``commit`` on its batch with ``cond`` held (``released`` around its write).

        Raises
        ------
        BindError
            What ``commit`` set for ``me``: it does not fit, or its group's claim could not
            be written.
        """
        with self.cond:
            self.queue.append(me)
            while not me.done:
                if self.writing:
                    self.cond.wait()
                    continue
                self.writing = True
                batch, self.queue = self.queue, []
                try:
                    commit(batch)
                finally:
                    for q in batch:
                        q.done = True
                    self.writing = False
                    self.cond.notify_all()
        if me.error is not None:
            raise me.error
        assert me.record is not None
        return me.record

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """The leader's write, with ``cond`` released so that binds arriving meanwhile queue."""
        self.cond.release()
        try:
            yield
        finally:
            self.cond.acquire()
