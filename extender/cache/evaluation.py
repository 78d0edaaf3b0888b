"""``Evaluator``: a pod scored on candidate nodes against the ledger's current arrays.

The one evaluator of every verb: filter and prioritize (``evaluate``), bind (``on_node``),
over ``scoring.incremental.IncrementalScorer``, which keeps each node's result per pod shape
until its row (or the cluster-wide terms, past the tolerance) moves. Two memos, both keyed
on what they were computed from: the candidate list's rows (``inbound.candidates``), reused
while kube-scheduler sends the same names to the same state, and the last evaluation,
reused when prioritize, then bind, follow filter for the same pod with nothing changed
(``Ledger.generation``). Reads only; the caller holds the cache lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from extender.cache.ledger import Ledger
from extender.cache.records import CandidateEvaluation
from extender.translate import inbound
from podspec.pods import PodIntent
from scoring.drift import Tolerance
from scoring.evaluated import Evaluation
from scoring.incremental import IncrementalScorer
from scoring.request import PodRequest
from scoring.scorer import Scorer
from scoring.state import ClusterState


@dataclass(slots=True)
class _Memo:
    """The last evaluation: kube-scheduler calls prioritize right after filter, for the same
    pod, on the nodes filter passed (or a subset); node scores do not depend on the set."""

    generation: int
    intent: PodIntent
    request: PodRequest
    candidates: inbound.Candidates
    result: CandidateEvaluation
    passed: list[str] | None = None


class Evaluator:
    """Scores pods for the verbs; see the module notes. One per scorer (a reload makes a new one)."""

    def __init__(self, scorer: Scorer, tolerance: Tolerance) -> None:
        self.tolerance = tolerance
        self._incremental = IncrementalScorer(scorer, tolerance)
        self._memo: _Memo | None = None
        self._candidates: tuple[ClusterState, inbound.Candidates] | None = None

    def evaluate(self, ledger: Ledger, intent: PodIntent, names: Sequence[str]) -> CandidateEvaluation:
        """Score ``intent`` on the named nodes, with its tenant's admission (no change to
        the allocations); the previous evaluation when it still holds."""
        memo = self._memo
        if memo is not None and memo.generation == ledger.generation and memo.intent == intent:
            ev = memo.result.evaluation
            if memo.passed is None:
                memo.passed = memo.candidates.passed(ev.node_fits)
            if names == memo.passed:  # what kube-scheduler sends: the nodes filter passed
                positions: np.ndarray | None = np.flatnonzero(ev.node_fits)
            else:
                positions = memo.candidates.positions(names)
            if positions is not None:
                return CandidateEvaluation(list(names), [], ev.take(positions), memo.result.rejection)
        state = ledger.state
        kept = self._candidates
        if kept is not None and kept[0] is state and kept[1].names == names:
            cand = kept[1]
        else:
            cand = inbound.candidates(state, names)
            self._candidates = (state, cand)
        request = inbound.pod_request(intent, state)
        ev = self._incremental.evaluate(state, request, cand.rows)
        rejection = ledger.tenancy.admission(intent, inbound.admission_memory_mib(intent))
        result = CandidateEvaluation(cand.known, cand.unknown, ev, rejection, cand.names_array())
        self._memo = _Memo(ledger.generation, intent, request, cand, result)
        return result

    def on_node(self, state: ClusterState, request: PodRequest, row: int, generation: int) -> Evaluation:
        """The pod on one node (bind's re-check, GPUs chosen): the last evaluation's row when
        it scored the same request there and nothing changed since (``generation``, the
        ledger's now), else evaluated anew."""
        memo = self._memo
        if memo is not None and memo.generation == generation and memo.request == request:
            at = np.flatnonzero(memo.candidates.rows == row)
            if at.size:
                return memo.result.evaluation.take(at[:1])
        return self._incremental.evaluate(state, request, np.array([row], dtype=np.int64))
