"""Adaptive balance: two-sided resource balance that turns one-sided as multi-GPU pods rise.

Notes
-----
With ``b2`` the two-sided balance of ``scoring.strategies.resource_balance``, ``b1`` the one-sided
balance of ``scoring.strategies.stranding`` (both in [0, 1], from the node's CPU, memory and GPU
utilizations after placement) and ``s`` the multi-GPU share of the learned GPU demand
(``scoring.strategies.multi_gpu_reserve.multi_gpu_share``)::

    lam        = min(1, s / S_ONE_SIDED)
    k          = 1 + (PRESSURE_GAIN - 1) * clip((p - PRESSURE_START) / (PRESSURE_FULL - PRESSURE_START), 0, 1)
    node_score = ((1 - lam) * k * b2 + ONE_SIDED_GAIN * lam * b1) / 2

so at weight ``w`` it is ``resource_balance`` at weight ``w / 2`` while multi-GPU pods are
rare, and ``stranding`` at weight ``w`` once they are ``S_ONE_SIDED`` of the GPU demand.
``p`` is the cluster's CPU pressure (``cpu_pressure``: CPU utilization over GPU
utilization on the GPU nodes); where CPU fills as fast as the GPUs (``p >= 1``) the
two-sided term counts double (``k = 2``, ``resource_balance`` at ``w``), below
``PRESSURE_START`` it is unchanged. With ``k <= 2`` and ``ONE_SIDED_GAIN = 2`` the score
stays in [0, 1].
Why: next to FGD (``scoring.strategies.fgd``) the two-sided balance is what keeps CPU and memory from
stranding GPUs where CPU is scarce (openb cpu250, seed 42 in process: 6.87 % unallocated at
100 % arrived against 9.56 % for FGD alone), but it also draws CPU-light pods onto empty
nodes, and those are the 8-GPU nodes multi-GPU pods need (multigpu40: 3.51 %, FGD alone
3.18 %). The one-sided form only penalises host use running ahead of the GPUs, so it
leaves empty nodes alone (``fgd`` + ``stranding`` 0.2: multigpu40 3.06 %, but cpu250
7.39 %). Switching by ``s`` gets both on seed 42: cpu250 6.85 %, multigpu40 3.09 %,
multigpu30 3.55 % (two-sided: 3.69 %), default 4.29 % (4.26 %); ``benchmarks/README.md``
has the full comparison. Adding the two terms at fixed weights instead was worse on default
(``resource_balance`` 0.05 + ``stranding`` 0.2: 5.61 %). ``s`` is 0 while no workload is
known (two-sided). The pressure gain: openb cpu250 replays run at ``p`` about 1.03 all
along (CPU-only pods fill the hosts) and default at about 0.83 (logged in replays); from
the arrival sequences cpu200 is near 0.92, gpushare100 near 0.91 and every other variant
below 0.9. Balance at twice the weight is what pays on cpu250 (ten seeds: 6.77 % against
6.95 %), and default is untouched (k = 1 there: the same placements); cpu200 and
gpushare100 come out slightly lower (``benchmarks/README.md``, "CPU pressure"). No
per-GPU preference.

Past capacity where pods leave, the weight fades: with ``churn`` the learned workload's
(``WorkloadModel.churn``) and ``room = clip(2 F / W - 1, 0, 1)``
(``scoring.utilization.room_for_waiting``, consolidation's measure of whether the free room
could hold what waits)::

    gain = 1 - churn * (1 - room)                   (the factor on the weight: ``weight_gain``)

1 where no GPU pod has left (the arrivals-only replay, cold start: placements unchanged) or
while the room holds what waits; 0 where pods leave as fast as they come and twice the room
waits. Why: there every freed GPU is taken at once and the balance's pull toward nodes whose
host use matches the GPUs outweighs the gap terms that serve the most pods (churn replay at
1.2 x capacity, 76 nodes, 2 h, seeds 42-46: without ``adaptive_balance`` +0.35 points of
allocation on average over the default, and it was 0.16 below ``fgd`` on seeds 47-51 of
the full replay; faded so, 94.61 / 95.68 / 95.06 / 95.02 / 94.87 % against 94.21 / 95.22 /
94.61 / 95.08 / 94.60 before and ``fgd`` 94.56 / 95.32 / 94.62 / 95.24 / 94.77;
``docs/decisions/0022-churn-default.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.memo import Memo
from scoring.row_totals import RowTotals
from scoring.state import ClusterState
from scoring.utilization import balance, host_lead, multi_gpu_share, room_for_waiting

NAME = "adaptive_balance"

TERM = "cpu_pressure"
"""This strategy's cluster-wide term (``cluster_term``): the effective CPU pressure."""

S_ONE_SIDED = 0.3
"""Multi-GPU share of the GPU demand at which the balance is one-sided only."""

ONE_SIDED_GAIN = 2.0
"""Weight of the one-sided form relative to the two-sided one."""

PRESSURE_START = 0.9
"""CPU pressure from which the two-sided term gains weight."""

PRESSURE_FULL = 1.0
"""CPU pressure at which the two-sided term has ``PRESSURE_GAIN`` times its weight."""

PRESSURE_GAIN = 2.0
"""Most the two-sided term is multiplied by (at most 2 keeps the score in [0, 1])."""

gpu_score = None
"""No per-GPU preference: balance is a node property."""


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Two- or one-sided CPU/memory-to-GPU balance after placement, by multi-GPU demand.

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool
        Unused.

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 0 for a node without GPUs or without allocatable CPU or memory.
    """
    two_sided, one_sided = mix(ctx)
    two = balance(ctx)
    one = host_lead(ctx)
    return (two_sided * two + one_sided * one) / 2.0


def mix(ctx: FitContext) -> tuple[float, float]:
    """The factors of the two- and the one-sided balance in ``node_score``: ``(1 - lam) * k``
    and ``ONE_SIDED_GAIN * lam`` (module notes), from the workload and the CPU pressure."""
    lam = min(1.0, multi_gpu_share(ctx.tasks) / S_ONE_SIDED)
    term = ctx.terms.get(TERM)
    pressure = float(term[0]) if isinstance(term, tuple) else 0.0
    k = 1.0 + (PRESSURE_GAIN - 1.0) * pressure_ramp(pressure)
    return (1.0 - lam) * k, ONE_SIDED_GAIN * lam


def pressure_ramp(pressure: float) -> float:
    """``clip((p - PRESSURE_START) / (PRESSURE_FULL - PRESSURE_START), 0, 1)`` for ``p = pressure``."""
    return min(1.0, max(0.0, (pressure - PRESSURE_START) / (PRESSURE_FULL - PRESSURE_START)))


def effective_pressure(pressure: float) -> float:
    """The CPU pressure as the score sees it: clipped to the band where ``pressure_ramp``
    moves (below ``PRESSURE_START`` and above ``PRESSURE_FULL`` it is flat), so a change
    outside the band is no change of the term."""
    return min(max(pressure, PRESSURE_START), PRESSURE_FULL)


PRESSURE_GPU_FLOOR = 0.1
"""GPU utilization below which ``cpu_pressure`` divides by this instead (a near-empty cluster)."""


def cpu_pressure(state: ClusterState) -> float:
    """How fast CPU fills against the GPUs on the GPU nodes, cluster-wide.

    ``u_cpu / max(u_gpu, PRESSURE_GPU_FLOOR)`` with ``u_cpu`` the requested over allocatable
    CPU and ``u_gpu`` the allocated over total GPU share, both summed over the nodes that
    have GPUs (CPU-only nodes strand no GPU). Above 1 the CPU runs out first, and what is
    left of the GPUs then is stranded (openb cpu250 replays run at about 1.03 throughout,
    default at about 0.83).

    Parameters
    ----------
    state : ClusterState
        Read only.

    Returns
    -------
    float
        ``>= 0``; 0 when no node has GPUs or allocatable CPU.
    """
    return _pressure(_pressure_sums(state, slice(None)).sum(axis=0))


def _pressure_sums(state: ClusterState, rows: NDArray[np.int64] | slice) -> NDArray[np.int64]:
    """Per row (m, 4): GPU share total and used (milli), and on GPU nodes CPU allocatable
    and requested (milli); summed by ``cpu_pressure``, or kept by ``RowTotals``."""
    total = state.node_gpu_total_milli[rows]
    gpu_node = total > 0
    return np.stack([total, state.node_gpu_used_milli[rows], np.where(gpu_node, state.cpu_alloc_milli[rows], 0),
                     np.where(gpu_node, state.cpu_used_milli[rows], 0)], axis=1)


def _pressure_row(state: ClusterState, row: int) -> tuple[int, int, int, int]:
    """``_pressure_sums`` of one row, as integers."""
    total = int(state.node_gpu_total_milli[row])
    gpu_node = total > 0
    return (total, int(state.node_gpu_used_milli[row]), int(state.cpu_alloc_milli[row]) if gpu_node else 0,
            int(state.cpu_used_milli[row]) if gpu_node else 0)


def _pressure(sums: Sequence[int]) -> float:
    total_milli, used_milli, cpu_alloc, cpu_used = (int(x) for x in sums)
    if total_milli <= 0 or cpu_alloc <= 0:
        return 0.0
    return cpu_used / cpu_alloc / max(used_milli / total_milli, PRESSURE_GPU_FLOOR)


Term = tuple[float, float]
"""``(effective CPU pressure, weight gain in [0, 1])``."""


def overload_gain(churn: float, room: float) -> float:
    """``1 - churn * (1 - room)``: the weight's factor, in [0, 1] (module notes)."""
    return 1.0 - churn * (1.0 - room)


def cluster_term(state: ClusterState, memo: Memo) -> Term:
    """``(effective_pressure(cpu_pressure(state)), overload_gain)``: what ``node_score`` and
    ``weight_gain`` read as ``ctx.terms[TERM]``. The gain is 1 while no GPU pod has left
    (``WorkloadModel.churn`` 0: the arrivals-only replay places as before) or while the
    free room holds what waits (``scoring.utilization.room_for_waiting``). The pressure's sums
    are kept in ``memo`` by row version (``scoring.row_totals``): equal to ``cpu_pressure``'s."""
    sums = memo.slot(NAME, RowTotals).of(state, _pressure_sums, _pressure_row)  # a bind moves one row
    pressure = effective_pressure(_pressure(sums))
    churn = state.workload.churn()
    return (pressure, overload_gain(churn, room_for_waiting(state)) if churn > 0.0 else 1.0)


def weight_gain(terms: Mapping[str, object]) -> float:
    """The factor on this strategy's weight: the term's gain; 1 without a term."""
    term = terms.get(TERM)
    return float(term[1]) if isinstance(term, tuple) else 1.0


GAIN_DRIFT_SCALE = 0.1
"""A change of the gain counts a tenth in ``term_drift``: the pressure's tolerance of 0.002
is then 0.02 of the gain, consolidation's (``scoring.strategies.consolidation.TERM_TOLERANCE``)."""


def term_drift(frozen: object, now: object) -> float:
    """How far the term moved: the larger of the change of the effective pressure and a
    tenth of the change of the gain (``GAIN_DRIFT_SCALE``); infinite for a term not of this shape."""
    if not isinstance(frozen, tuple) or not isinstance(now, tuple):
        return float("inf")
    return max(abs(float(now[0]) - float(frozen[0])), GAIN_DRIFT_SCALE * abs(float(now[1]) - float(frozen[1])))


TERM_TOLERANCE = 0.002
"""The shipped drift allowed before every kept row is scored anew (``scoring.incremental``):
2 % of the ramp (``benchmarks/README.md``)."""
