"""kube-scheduler's extender verbs, one function each, over the cache.

Each module holds one verb: its request type (a pydantic mirror of the
``k8s.io/kube-scheduler/extender/v1`` Go type; keys are the Go field names), the function
that answers it, and the reply it builds, once. The HTTP routes (``extender.routes``) and the
in-process replay (``benchmarks.extender_client.InProcessClient``) call the same functions, so the two
cannot disagree. Every verb returns a ``Reply``; none raises on bad input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """Base of the request types: unknown keys ignored (Go decodes leniently), frozen."""

    model_config = ConfigDict(extra="ignore", frozen=True)


@dataclass(frozen=True, slots=True)
class Reply:
    """A verb's answer: the wire JSON (a plain dict or list, serialized as is) and its status.

    Attributes
    ----------
    body : dict or list
        The reply in kube-scheduler's Go field spelling.
    status : int
        HTTP status: 200, or 400 when the request could not be read (``body["Error"]`` says why).
    reasons : ndarray of int8, shape (n_candidates,), optional
        ``filter`` only: each known candidate's ``scoring.fit.Reason`` code (for metrics).
    unknown : int
        ``filter`` only: candidates not in gpufrac's cache.
    result : str
        ``bind`` only: ``ok`` or ``BindError.reason``; ``preempt`` only: ``possible`` or
        ``impossible`` (for metrics).
    victims : int
        ``preempt`` only: victims on the answered node with the fewest.
    """

    body: Any
    status: int = 200
    reasons: NDArray[np.int8] | None = None
    unknown: int = 0
    result: str = ""
    victims: int = 0

    @property
    def error(self) -> str:
        """The reply's ``Error`` (``""`` when there is none)."""
        return str(self.body.get("Error", "")) if isinstance(self.body, dict) else ""
