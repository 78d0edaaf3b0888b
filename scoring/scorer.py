"""Weights, and the scorer that combines the registered strategies (``scoring.registry``).

For one-GPU pods the scorer reuses a
strategy's per-GPU score as its node score when the module says they are the same number.
``build_scorer`` validates a ``ScoringConfig`` once and returns a ``Scorer``; nothing is
parsed again per request.

The same objective chooses the GPUs and scores the node: the GPUs on a node are the
``gpu_count`` fitting GPUs with the highest weighted sum of the per-GPU scores (ties: lowest
column), and the node score is the weighted mean of every strategy's node score given
those GPUs.
"""

from __future__ import annotations

import difflib
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from scoring.arrivals import RUNNING, Learning
from scoring.evaluated import BREAKS_EMPTY_SHIFT, Evaluation
from scoring.fit import ClusterTerms, FitContext, cluster_terms, fit
from scoring.memo import Memo
from scoring.reduce import clip, mean_at, take_cols
from scoring.registry import STRATEGIES, Strategy, Term
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass, QoSPolicy
from scoring.shape_prior import ShapePrior
from scoring.state import ClusterState


class Ties(enum.StrEnum):
    """How ``Evaluation.best`` orders nodes whose scores are equal.

    - ``keep_whole``: the classic binpack order, so that capacity stays whole where the
      scores do not separate candidates: first a node that already holds GPU pods over an
      empty one, then the fewest wholly free GPUs taken, then the least GPU share left on
      the node; then the lowest row. For CPU-only pods: the lowest row. And while no
      counted pod has taken a whole node of the largest size (``ClusterTerms.whole_node_unseen``:
      the shape is known only from the prior), a near-tie counts too: when the best node is
      empty and a used node scores within ``KEEP_WHOLE_BAND`` of it, the best used node wins
      (decision record 0011).
    - ``row``: the lowest row (node names in order), the tie-break of Weng et al.'s
      simulator, which the paper baselines need to reproduce the published numbers.
    """

    KEEP_WHOLE = "keep_whole"
    ROW = "row"


FitFn = Callable[[ClusterState, PodRequest, NDArray[np.int64], QoSPolicy, ClusterTerms | None, Memo | None],
                 FitContext]
"""``scoring.fit.fit``'s signature: what ``Scorer`` decides feasibility with."""

Combined = tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]
"""``(score, cols, chosen_mem_mib, gpu_mem_max_mib, keep_whole_rank)``: an ``Evaluation``'s
arrays as ``Scorer.evaluate`` combines them (cols -1 and memory 0 on infeasible rows)."""

CombineFn = Callable[[FitContext, tuple[tuple[Strategy, float], ...]], Combined | None]
"""``(ctx, plan) -> Combined``, or None where it does not cover the plan: ``Scorer.evaluate``'s
combination of the weighted strategies of a pod of one or more GPUs, computed faster (the
same numbers; ``extender.compiled.compiled_plan``)."""

KEEP_WHOLE_BAND = 2e-3
"""Score distance (of the [0, 1] node score) within which ``Ties.KEEP_WHOLE`` prefers a used
node to breaking an empty one, while ``ClusterTerms.whole_node_unseen``. On the cold-start
benchmark the balance terms put an empty node 1e-4 to 5e-4 ahead of a used one, which
spread 2,000 one-GPU pods over 463 of 500 nodes (an 8-GPU pod then fitted on 37); 1e-3
kept 250 whole. After one 8-GPU pod, half-GPU pods to 50 % put an empty node 1.01e-3 ahead
(``adaptive_balance`` with one multi-GPU pod in the learned mix): 1e-3 touched 468 nodes
against bestfit's 251, 2e-3 touches as many as bestfit (``benchmarks/README.md``, "Cold
start"; decision record 0022)."""


@dataclass(frozen=True)
class ScoringConfig:
    """Strategy weights, with optional per-QoS-class overrides.

    Parameters
    ----------
    weights : mapping of str to float
        Strategy name -> weight >= 0; strategies not named have weight 0.
    qos_overrides : mapping of str to mapping of str to float
        QoS class wire name (``guaranteed``...) -> weights replacing ``weights`` entries for
        pods of that class.
    qos : QoSPolicy
        What each QoS class may share (feasibility, not score).
    prior : ShapePrior
        The shapes the learned workload starts from (``scoring.shape_prior.ShapePrior``).
    ties : Ties
        How nodes of equal score are ordered.
    learning : Learning
        What the learned workload counts: the pods running and waiting, or the arrivals
        (``scoring.workload.Learning``).
    """

    weights: Mapping[str, float]
    qos_overrides: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    qos: QoSPolicy = field(default_factory=QoSPolicy)
    prior: ShapePrior = field(default_factory=ShapePrior)
    ties: Ties = Ties.KEEP_WHOLE
    learning: Learning = RUNNING

    def __post_init__(self) -> None:
        # Read-only copies: a preset is shared by everyone who asks for it.
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "qos_overrides", MappingProxyType(
            {q: MappingProxyType(dict(w)) for q, w in self.qos_overrides.items()}))


def validate_config(config: ScoringConfig, *, path: str = "scoring") -> list[str]:
    """Check a config; return one ``field.path: message`` per problem (empty when valid).

    Parameters
    ----------
    config : ScoringConfig
    path : str
        Prefix of the field paths in the messages.

    Returns
    -------
    list of str
    """
    errors: list[str] = []

    def check_weights(weights: Mapping[str, float], where: str) -> None:
        for name, w in weights.items():
            if name not in STRATEGIES:
                close = difflib.get_close_matches(name, list(STRATEGIES), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                errors.append(
                    f"{where}.{name}: unknown strategy; {hint}known: {', '.join(sorted(STRATEGIES))}"
                )
            elif isinstance(w, bool) or not isinstance(w, (int, float)):
                errors.append(f"{where}.{name}: must be a number, got {w!r}")
            elif not math.isfinite(w) or w < 0:
                errors.append(f"{where}.{name}: must be a finite number >= 0, got {w!r}")

    check_weights(config.weights, f"{path}.weights")
    qos_names = {q.wire_name for q in QoSClass}
    for qos, weights in config.qos_overrides.items():
        if qos not in qos_names:
            errors.append(f"{path}.qos_overrides.{qos}: unknown QoS class; known: "
                          f"{', '.join(sorted(qos_names))}")
            continue
        check_weights(weights, f"{path}.qos_overrides.{qos}")
    if not errors:
        overrides: list[str | None] = [None, *config.qos_overrides]
        for name in overrides:
            merged = {**config.weights, **(config.qos_overrides.get(name, {}) if name else {})}
            if sum(merged.values()) <= 0:
                where = f"{path}.qos_overrides.{name}" if name else f"{path}.weights"
                errors.append(f"{where}: at least one weight must be > 0")
    return errors


class Scorer:
    """Weighted combination of registered strategies (build with ``build_scorer``).

    ``strategies`` is the registry the weights' names are looked up in: ``STRATEGIES`` by
    default, or one whose score functions compute the same numbers faster (a compiled
    ``gpu_score`` under the same name, checked against this package's by its tests);
    ``feasibility`` likewise computes ``scoring.fit.fit``'s ``FitContext``.
    """

    def __init__(self, weights_by_qos: Mapping[QoSClass, Mapping[str, float]],
                 qos_policy: QoSPolicy | None = None, prior: ShapePrior | None = None,
                 ties: Ties = Ties.KEEP_WHOLE, learning: Learning = RUNNING,
                 strategies: Mapping[str, Strategy] = STRATEGIES, feasibility: FitFn = fit,
                 combination: CombineFn | None = None) -> None:
        self.qos_policy = qos_policy if qos_policy is not None else QoSPolicy()
        self.prior = prior if prior is not None else ShapePrior()
        self.ties = ties
        self.learning = learning
        self._fit = feasibility
        self._combine = combination
        self._plans: dict[QoSClass, tuple[tuple[Strategy, float], ...]] = {
            qos: tuple((strategies[n], float(w)) for n, w in sorted(ws.items()) if w > 0)
            for qos, ws in weights_by_qos.items()
        }
        # Every registered strategy's term, weighted or not: the incremental scorer's
        # refreshes (and so the published baselines' placements) stay what they were before
        # the terms moved into their strategies. Only the weighted ones would be cheaper.
        self.terms: tuple[Term, ...] = tuple(sorted(
            (s.term for s in strategies.values() if s.term is not None), key=lambda t: t.name))
        """The strategies' cluster-wide terms, by name."""

    def cluster_terms(self, state: ClusterState, memo: Memo | None = None) -> ClusterTerms:
        """The state's ``ClusterTerms`` with the strategies' own terms (``terms``).

        Parameters
        ----------
        state : ClusterState
            Read only.
        memo : Memo, optional
            The evaluation owner's (``scoring.memo``), where a term keeps what it computed last.
        """
        base = cluster_terms(state)
        if not self.terms:
            return base
        memo = memo if memo is not None else Memo()
        return replace(base, strategy_terms=MappingProxyType({t.name: t.compute(state, memo) for t in self.terms}))

    def use(self, strategies: Mapping[str, Strategy], feasibility: FitFn, combination: CombineFn | None = None) -> None:
        """Swap in ``build_scorer``'s ``strategies``, ``feasibility`` and ``combination`` of the
        same numbers, in place."""
        self._combine = combination
        self._fit, self._plans = feasibility, {
            q: tuple((strategies[s.name], w) for s, w in plan) for q, plan in self._plans.items()}

    def reads_row(self, qos: QoSClass) -> bool:
        """Whether a weighted strategy of ``qos`` reads which row it scores (``Strategy.reads_row``):
        then rows of equal content may score differently for its pods."""
        return any(strat.reads_row for strat, _ in self._plans[qos])

    def weights(self, qos: QoSClass) -> dict[str, float]:
        """Effective weights for pods of one QoS class."""
        return {s.name: w for s, w in self._plans[qos]}

    def evaluate(
        self, state: ClusterState, request: PodRequest, rows: NDArray[np.int64],
        terms: ClusterTerms | None = None, memo: Memo | None = None,
    ) -> Evaluation:
        """Feasibility, node scores and GPU choice of ``request`` on ``rows``.

        Parameters
        ----------
        state : ClusterState
            Read only.
        request : PodRequest
        rows : ndarray of shape (m,), int64
        terms : ClusterTerms, optional
            Cluster-wide terms (``scoring.fit.fit``); the state's current ones
            (``cluster_terms``) by default.
        memo : Memo, optional
            What the caller keeps between evaluations (``scoring.memo``); a fresh one when None.

        Returns
        -------
        Evaluation
        """
        memo = memo if memo is not None else Memo()
        if terms is None:
            terms = self.cluster_terms(state, memo)
        ctx = self._fit(state, request, rows, self.qos_policy, terms, memo)
        plan = self._plans[request.qos]
        if any(strat.gain is not None for strat, _ in plan):
            # A strategy whose gain is 0 now (``scoring.strategies``: ``weight_gain``) is left
            # out, its weight too: the others score exactly as without it.
            plan = tuple((strat, w * strat.gain(ctx.terms) if strat.gain is not None else w) for strat, w in plan)
            plan = tuple((strat, w) for strat, w in plan if w > 0)
        m, k = ctx.rows.shape[0], request.gpu_count
        if k == 0:
            # CPU-only pods (a profile that sends every pod to the extender): the node-level
            # strategies score the node (FGD: how taking CPU strands GPUs; best fit: how little
            # is left); per-GPU strategies have nothing to prefer and count 0.
            none = np.zeros(ctx.gpu_fits.shape, dtype=bool)
            score = np.zeros(m)
            for strat, w in plan:
                if strat.node_score is not None:
                    score += w * strat.node_score(ctx, none)
            total_w = sum(w for _, w in plan) or 1.0
            score = np.where(ctx.node_fits, clip(score / total_w, 0.0, 1.0), 0.0)
            return Evaluation.of(ctx, score, np.zeros((m, 0), dtype=np.int64))
        if ctx.gpu_fits.shape[1] < k:
            # No node has k GPU columns (e.g. only nodes whose inventory has not arrived):
            # fit already failed every row with TOO_FEW_GPUS; there is nothing to choose.
            return Evaluation.of(ctx, np.zeros(m), np.full((m, k), -1, dtype=np.int64))
        combined = self._combine(ctx, plan) if self._combine is not None else None
        if combined is not None:
            score, cols, mem, mem_max, rank = combined
            if self.ties != Ties.KEEP_WHOLE:
                return Evaluation(ctx.request, ctx.rows, ctx.node_fits, ctx.reason, score, cols, mem, mem_max,
                                  np.zeros(m, dtype=np.int64), ctx)
            return Evaluation(ctx.request, ctx.rows, ctx.node_fits, ctx.reason, score, cols, mem, mem_max, rank,
                              ctx, KEEP_WHOLE_BAND if ctx.whole_node_unseen else 0.0)
        per_gpu = [(strat, w, strat.gpu_score(ctx)) for strat, w in plan if strat.gpu_score]
        pref = np.zeros(ctx.gpu_fits.shape)
        for _, w, g in per_gpu:
            pref += w * g
        pref = np.where(ctx.gpu_fits, pref, -np.inf)
        if k == 1:
            cols = np.argmax(pref, axis=1)[:, None]
        else:
            cols = np.argsort(-pref, axis=1, kind="stable")[:, :k]
        chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
        chosen[np.arange(m)[:, None], cols] = True  # np.put_along_axis, without its index grid in Python
        chosen &= ctx.node_fits[:, None]
        total_w = sum(w for _, w in plan) or 1.0
        score = np.zeros(m)
        reused = set()
        for strat, w, g in per_gpu:
            # Else its node_score below scores the node, unless it is the same number.
            if strat.node_score is None or (k == 1 and strat.one_gpu_node_score_is_gpu_score):
                score += w * mean_at(g, cols)
                reused.add(strat.name)
        for strat, w in plan:
            if strat.node_score is not None and strat.name not in reused:
                score += w * strat.node_score(ctx, chosen)
        score = np.where(ctx.node_fits, clip(score / total_w, 0.0, 1.0), 0.0)
        cols = np.where(ctx.node_fits[:, None], cols, -1).astype(np.int64)
        if self.ties != Ties.KEEP_WHOLE:
            return Evaluation.of(ctx, score, cols)
        band = KEEP_WHOLE_BAND if ctx.whole_node_unseen else 0.0
        return Evaluation.of(ctx, score, cols, keep_whole_rank(ctx, cols), band)


def keep_whole_rank(ctx: FitContext, cols: NDArray[np.int64]) -> NDArray[np.int64]:
    """``Ties.KEEP_WHOLE``'s order of the candidates as one integer, lower first.

    Parameters
    ----------
    ctx : FitContext
    cols : ndarray of shape (m, k), int64
        The chosen GPU columns, ``k >= 1``; -1 on infeasible rows.

    Returns
    -------
    ndarray of shape (m,), int64
        ``breaks_empty_node * 2**40 + empty_gpus_taken * 2**24 + free_left_milli``:
        whether the node holds no GPU share yet, how many of the chosen GPUs are wholly
        free, and the node's free GPU share after placement (clipped to ``2**24 - 1``).
    """
    k = cols.shape[1]
    taken = take_cols(ctx.free_milli, np.maximum(cols, 0))
    empty_taken = ((taken >= MILLI_PER_GPU) & (cols >= 0)).sum(axis=1).astype(np.int64)
    breaks_node = (ctx.node_used_milli == 0).astype(np.int64)
    left = clip(ctx.node_total_milli - ctx.node_used_milli - k * ctx.request.gpu_milli, 0, (1 << 24) - 1)
    rank: NDArray[np.int64] = (breaks_node << BREAKS_EMPTY_SHIFT) + (np.minimum(empty_taken, (1 << 16) - 1) << 24) + left
    return rank


def build_scorer(config: ScoringConfig, strategies: Mapping[str, Strategy] = STRATEGIES,
                 feasibility: FitFn = fit, combination: CombineFn | None = None) -> Scorer:
    """Validate ``config`` once and build the scorer.

    Parameters
    ----------
    config : ScoringConfig
    strategies : mapping of str to Strategy
        The registry to score with (``Scorer``): ``STRATEGIES``, or the same names with
        faster score functions of the same numbers.
    feasibility : callable
        ``scoring.fit.fit``, or a faster function of the same ``FitContext``.
    combination : callable, optional
        ``CombineFn``: the weighted strategies combined faster, the same numbers (None: the
        scorer's own combination).

    Returns
    -------
    Scorer

    Raises
    ------
    ValueError
        With every ``field.path: message`` problem, one per line.
    """
    errors = validate_config(config)
    if errors:
        raise ValueError("\n".join(errors))
    by_qos = {
        qos: {**config.weights, **config.qos_overrides.get(qos.wire_name, {})}
        for qos in QoSClass
    }
    return Scorer(by_qos, config.qos, config.prior, config.ties, config.learning, strategies, feasibility,
                  combination)
