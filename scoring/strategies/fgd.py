"""FGD: place the pod where the node's fragmentation grows least.

Notes
-----
Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC '23, section 4 (the measure is ``scoring.fragmentation``).
For node ``n`` with free share ``f_g`` per GPU, free CPU ``C``, free memory ``M`` and the
target workload ``{(k_t, r_t, c_t, q_t, A_t, h_t): p_t}`` (``A_t``: the GPU models type ``t``
accepts, from ``gpu_spec``; ``h_t``: the GPU memory per GPU it asks for explicitly, 0 for its
share's proportion) and ``m_g`` the free memory of GPU ``g``::

    u_tg = [f_g >= r_t] * [model of g in A_t] * [m_g >= h_t]     (GPU g usable by t)
    F_n  = sum_t p_t * ( sum_g f_g                 if t cannot run on n
                         sum_g f_g * (1 - u_tg)    otherwise )
    dF  = F_n(after placing the pod) - F_n(before)
    score = trunc(100 * sigmoid(-dF / 1000)) / 100

so the node (and GPU) with the smallest fragmentation increase scores highest. The score is
the authors' simulator's, integer 0..100 included (hkust-adsl/kubernetes-scheduler-simulator,
``pkg/simulator/plugin/fgd_score.go``: ``int64(sigmoid((F_before - F_after) / 1000) *
MaxNodeScore)``). The truncation matters: nodes within one step tie, and the published
4.77 % comes from ties broken by the smallest node name, which is gpufrac's own tie-break
(lowest cluster row; rows are in node-name order). With exact float scores instead, FGD
left 5.78 % of GPUs unallocated at 100 % arrived against 5.02 % (openb seed 42, all pods
through the extender, ``benchmarks/README.md``). The target workload is learned online
(``scoring.workload``: the GPU pods placed or waiting) instead of being read from a trace;
until a GPU pod is known every node scores 1/2. "Cannot run" means fewer than ``k_t`` usable
GPUs, or too little CPU or memory; a node of a model ``t`` does not accept is all fragment
for ``t`` (the simulator's ``NoAccess``).

GPU memory is gpufrac's dimension, not the paper's (whose trace asks for none): where pods
ask for memory, a GPU whose free memory no type can use is fragment even with share left,
and the reverse, so a pod that asks for little memory goes where memory-hungry types could
not have used the rest anyway. The per-GPU "after" takes the pod's memory from that GPU
(``FitContext.mem_req_mib``). Without such types (``TaskTypes.gpu_memory_mib`` None, every
openb pod list) nothing changes.

Per GPU (the GPU choice) ``dF`` is evaluated as if the pod took that GPU alone, with the
node's CPU and memory reduced by the pod's; the node score uses the GPUs actually chosen.
Both are differences of per-task counts, so the kernel is ``O(m * t * G)`` with no loop;
the per-GPU one runs once per distinct (node, free share, model) class of GPUs (``_classes``).
The counts depend on a type only through its share and model mask, so they are kept per
distinct (share, mask) column of the types (``_RowCounts``), adjusted there, and spread to
the types for the sums (the same integers).
"""

from __future__ import annotations

import threading

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.fragmentation import TaskTypes

NAME = "fgd"

SCORE_LEVELS = 100
"""The simulator's integer score range (kube-scheduler's ``MaxNodeScore``)."""

ONE_GPU_NODE_SCORE_IS_GPU_SCORE = True
"""For a one-GPU pod ``gpu_score`` is the node score with the pod on that GPU (same ``dF``)."""


def _fits(share: NDArray[np.integer], tasks: TaskTypes, allowed: NDArray[np.bool_] | None) -> NDArray[np.bool_]:
    """``share`` of shape (m, 1, G) or (m, t, G) -> GPUs each task can use (m, t, G)."""
    fits = share >= tasks.gpu_milli[None, :, None]
    return fits if allowed is None else fits & allowed


def _per_task(free: NDArray[np.int32], tasks: TaskTypes,
              allowed: NDArray[np.bool_] | None) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """For ``free`` of shape (m, G): how many GPUs each task can use (m, t), and the share on
    the GPUs it cannot use (m, t)."""
    f = free[:, None, :]
    fits = _fits(f, tasks, allowed)
    return fits.sum(axis=2), np.where(fits, np.int32(0), f).sum(axis=2)


def _host_fits(cpu_free: NDArray[np.int64], mem_free: NDArray[np.int64],
               tasks: TaskTypes) -> NDArray[np.bool_]:
    """(m,) CPU and memory -> (m, t): the node has the CPU and memory of each task."""
    return (cpu_free[:, None] >= tasks.cpu_milli[None, :]) & (mem_free[:, None] >= tasks.memory_mib[None, :])


def _expected(fragment: NDArray[np.integer], run: NDArray[np.bool_], total: NDArray[np.integer],
              tasks: TaskTypes, task_axis: int) -> NDArray[np.int64]:
    """``sum_t n_t * (fragment if t runs else total)`` over ``task_axis``: ``F_n`` times the
    number of pods ``N = sum_t n_t``, in integers, so the sum is exact in any order (the
    per-GPU and the node evaluation of the same placement give the same number)."""
    shape = [1] * run.ndim
    shape[task_axis] = -1
    expected: NDArray[np.int64] = (np.where(run, fragment, total) * tasks.count.reshape(shape)).sum(axis=task_axis)
    return expected


def _fragmentation(free: NDArray[np.int32], cpu_free: NDArray[np.int64], mem_free: NDArray[np.int64],
                   tasks: TaskTypes, allowed: NDArray[np.bool_] | None) -> NDArray[np.int64]:
    """``N * F_n`` for ``free`` of shape (m, G) -> (m,); see module notes and ``_expected``."""
    cnt, small = _per_task(free, tasks, allowed)
    return _from_counts(cnt, small, free.sum(axis=1), _host_fits(cpu_free, mem_free, tasks), tasks)


def _from_counts(cnt: NDArray[np.integer], small: NDArray[np.integer], total: NDArray[np.integer],
                 host: NDArray[np.bool_], tasks: TaskTypes) -> NDArray[np.int64]:
    """``N * F_n`` (m,) from ``_per_task``'s ``cnt`` and ``small`` (m, t), the free share
    ``total`` (m,) and whether the node has each type's CPU and memory ``host`` (m, t): a
    type runs where it has ``gpu_count`` usable GPUs and the host room."""
    return _expected(small, (cnt >= tasks.gpu_count[None, :]) & host, total[:, None], tasks, task_axis=1)


FEW_CELLS = 64
"""Up to this many GPU cells ``_classes`` groups them in a dictionary, past it with ``np.unique``
(the same classes, in another order, which no result depends on)."""


def _classes(free: NDArray[np.int32], model: NDArray[np.int64], cells: tuple[NDArray[np.intp], NDArray[np.intp]],
             mem_free: NDArray[np.int64] | None = None) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    """The distinct (row, free share, model[, free memory]) classes among ``cells`` (row and
    GPU indices into ``free`` and ``model``): a representative cell's row and GPU per class,
    and each cell's class (a representative is the class's first cell). GPUs alike in all of
    them give the same fragmentation terms."""
    r, g = cells
    # free share in [-3000, 1000] (best-effort oversubscription up to 4x); model ids past 62
    # share one mask bit (TaskTypes.allowed), so they may share a class.
    key = (r.astype(np.int64) * 1_000_003 + free[r, g].astype(np.int64) + 4_000) * 64 + np.minimum(model[r, g], 63)
    if r.shape[0] <= FEW_CELLS:  # a dictionary: np.unique's sort costs tens of calls
        keys = key.tolist() if mem_free is None else list(zip(key.tolist(), mem_free[r, g].tolist(), strict=True))
        ids: dict[object, int] = {}
        firsts: list[int] = []
        classes = []
        for i, k in enumerate(keys):
            j = ids.setdefault(k, len(firsts))
            if j == len(firsts):
                firsts.append(i)
            classes.append(j)
        first, inverse = np.array(firsts, dtype=np.intp), np.array(classes, dtype=np.intp)
    elif mem_free is not None:
        _, first, inverse = np.unique(np.stack([key, mem_free[r, g]], axis=1), axis=0, return_index=True,
                                      return_inverse=True)
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return r[first], g[first], inverse.reshape(-1)


def _with_memory(allowed: NDArray[np.bool_] | None, mem_free: NDArray[np.int64],
                 tasks: TaskTypes) -> NDArray[np.bool_]:
    """``allowed`` (m, t, G) or None, and GPU memory: a GPU is usable by a type only with the
    explicit memory the type asks (``TaskTypes.gpu_memory_mib`` set) free on it."""
    assert tasks.gpu_memory_mib is not None
    ok = mem_free[:, None, :] >= tasks.gpu_memory_mib[None, :, None]
    return ok if allowed is None else ok & allowed


class _RowCounts:
    """``_per_task``'s ``cnt`` and ``small`` (m, t) kept between evaluations, by state row
    (the evaluation owner's ``scoring.memo.Memo``, slot ``fgd``).

    They depend on a node's free shares and GPU models and on the task types' shares and
    model masks, not on the pod: between two pods one node changes. They are kept per
    distinct (share, mask) of the task types, in a canonical order (the learned workload
    reorders its types by count all the time; the set of shares changes rarely), and a row
    is recomputed when its free shares or models differ from the ones its kept counts came
    from (compared in full, so a row of another state, or whose node changed, is never
    served stale counts). Everything is dropped when the set of shares and masks changes.
    Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[object, ...] | None = None
        self._free = np.zeros((0, 0), dtype=np.int32)
        self._model = np.zeros((0, 0), dtype=np.int64)
        self._valid = np.zeros(0, dtype=bool)
        self._cnt = np.zeros((0, 0), dtype=np.int64)
        self._small = np.zeros((0, 0), dtype=np.int64)
        self._last_canonical: tuple[TaskTypes, tuple[TaskTypes, NDArray[np.intp],
                                                    tuple[bytes, bytes | None]]] | None = None

    def _canonical(self, tasks: TaskTypes) -> tuple[TaskTypes, NDArray[np.intp], tuple[bytes, bytes | None]]:
        """The distinct (share, mask) columns of ``tasks`` as types of their own, each type's
        column, and their key; remembered for the last ``tasks`` object (immutable, and kept
        for long by an incremental evaluation)."""
        last = self._last_canonical
        if last is not None and last[0] is tasks:
            return last[1]
        if tasks.model_mask is None:
            canon_milli, column = np.unique(tasks.gpu_milli, return_inverse=True)
            canon_mask = None
        else:
            pairs, column = np.unique(np.stack([tasks.gpu_milli, tasks.model_mask], axis=1), axis=0,
                                      return_inverse=True)
            canon_milli, canon_mask = pairs[:, 0], pairs[:, 1]
        ones = np.ones(canon_milli.shape[0], dtype=np.int64)
        canon = TaskTypes(ones, canon_milli, ones * 0, ones * 0, ones / ones.shape[0], ones, canon_mask)
        out = (canon, column.reshape(-1),
               (canon_milli.tobytes(), None if canon_mask is None else canon_mask.tobytes()))
        self._last_canonical = (tasks, out)
        return out

    def get(self, state_rows: NDArray[np.int64], free: NDArray[np.int32], model: NDArray[np.int64],
            tasks: TaskTypes) -> tuple[NDArray[np.int64], NDArray[np.int64], TaskTypes, NDArray[np.intp]]:
        """``cnt, small`` for ``free`` and ``model`` of shape (m, G) at ``state_rows`` (m,), per
        canonical column (m, c) each; the canonical columns as task types (their shares and
        masks; the rest placeholders); and each of ``tasks``' types' column (t,), so that
        ``cnt[:, column]`` is ``_per_task``'s ``cnt`` of ``tasks``."""
        canon, column, canon_key = self._canonical(tasks)
        n_gpus, n_canon = free.shape[1], canon.gpu_milli.shape[0]
        key = (n_gpus, *canon_key)
        with self._lock:
            if key != self._key:
                self._key = key
                self._valid = np.zeros(0, dtype=bool)
            need = int(state_rows.max()) + 1
            if need > self._valid.shape[0]:
                size = max(need, 2 * self._valid.shape[0])
                self._free = np.zeros((size, n_gpus), dtype=np.int32)
                self._model = np.zeros((size, n_gpus), dtype=np.int64)
                self._cnt = np.zeros((size, n_canon), dtype=np.int64)
                self._small = np.zeros((size, n_canon), dtype=np.int64)
                self._valid = np.zeros(size, dtype=bool)
            stale = np.flatnonzero(~self._valid[state_rows] | (self._free[state_rows] != free).any(axis=1)
                                   | (self._model[state_rows] != model).any(axis=1))
            if stale.size:
                cnt, small = _per_task(free[stale], canon, canon.allowed(model[stale]))
                rows = state_rows[stale]
                self._free[rows], self._model[rows] = free[stale], model[stale]
                self._cnt[rows], self._small[rows] = cnt, small
                self._valid[rows] = True
            return self._cnt[state_rows], self._small[state_rows], canon, column


def _usable_free(ctx: FitContext, rows: NDArray[np.int64]) -> NDArray[np.int32]:
    # int32: shares are at most a few thousand milli; half the memory traffic of int64.
    return np.where(ctx.gpu_exists[rows], ctx.free_milli[rows], 0).astype(np.int32)


def _usable_model(ctx: FitContext, rows: NDArray[np.int64], shape: tuple[int, ...]) -> NDArray[np.int64]:
    """Model ids of ``rows`` (padding -1 read as 0), as ``_RowCounts`` keys them; all 0 without models."""
    return np.zeros(shape, dtype=np.int64) if ctx.gpu_model is None else np.maximum(ctx.gpu_model[rows], 0)


def to_score(delta_n: NDArray[np.int64], tasks: TaskTypes) -> NDArray[np.float64]:
    """``N * dF`` -> the truncated sigmoid score (module notes).

    Parameters
    ----------
    delta_n : ndarray of any shape, int64
        ``F_n(after) - F_n(before)`` times the number of pods ``N = tasks.count.sum()``.
    tasks : TaskTypes

    Returns
    -------
    ndarray of the same shape, float64
        ``trunc(100 * sigmoid(-dF / 1000)) / 100``, in [0, 1].
    """
    delta = delta_n / float(tasks.count.sum())
    return np.trunc(SCORE_LEVELS / (1.0 + np.exp(delta / 1000.0))) / SCORE_LEVELS


def gpu_score(ctx: FitContext) -> NDArray[np.float64]:
    """Score per GPU of placing the pod's share on that GPU.

    Parameters
    ----------
    ctx : FitContext

    Returns
    -------
    ndarray of shape (m, max_gpus), float64
        In [0, 1]; 0 where the GPU does not fit; 1/2 everywhere it fits while no workload
        is known.
    """
    tasks, req = ctx.tasks, ctx.request
    if tasks is None:
        return np.where(ctx.gpu_fits, 0.5, 0.0)
    out = np.zeros(ctx.gpu_fits.shape)
    rows = np.flatnonzero(ctx.node_fits)  # only feasible nodes: the kernel is O(rows * t * G)
    if rows.size == 0:
        return out
    free = _usable_free(ctx, rows)
    cpu_free, mem_free = ctx.cpu_free_milli[rows], ctx.mem_host_free_mib[rows]
    model = _usable_model(ctx, rows, free.shape)
    memf = None if tasks.gpu_memory_mib is None or ctx.gpu_mem_free_mib is None else ctx.gpu_mem_free_mib[rows]
    column: NDArray[np.intp] | None = None
    if memf is None:
        # Counts of the current state per distinct (share, mask) of the types, shared by "before"
        # and every per-GPU "after"; kept between evaluations and recomputed only for the nodes
        # whose GPUs changed (``_RowCounts``). The per-GPU "after" runs on those columns (13
        # against 48 types on openb) and is spread to the types once.
        cnt_c, small_c, canon, column = ctx.memo.slot(NAME, _RowCounts).get(ctx.rows[rows], free, model, tasks)
        cnt, small = cnt_c[:, column], small_c[:, column]  # (m, t) each
    else:  # GPU memory is a dimension: the row cache keys on shares and models only
        allowed_now = None if ctx.gpu_model is None else tasks.allowed(model)
        cnt_c, small_c = cnt, small = _per_task(free, tasks, _with_memory(allowed_now, memf, tasks))
        canon = tasks
    total = free.sum(axis=1)
    before = _from_counts(cnt, small, total, _host_fits(cpu_free, mem_free, tasks), tasks)

    # The per-GPU "after" once per distinct (node, free share, GPU model) class of the GPUs
    # the pod fits: GPUs of a node alike in all three give the same dF (at 70 % allocated a
    # sixth to a tenth of the node x GPU cells; issue 24). The arithmetic per class is the
    # per-GPU one, so the scores are the same to the bit.
    fit_r, fit_g = np.nonzero(ctx.gpu_fits[rows])
    if fit_r.size == 0:
        return out
    pr, pg, cell_class = _classes(free, model, (fit_r, fit_g), memf)
    f = free[pr, pg][:, None]                                 # (u, 1)
    fp = f - np.int32(req.gpu_milli)                          # the share taken from that GPU
    milli = canon.gpu_milli[None, :]
    fits_old, fits_new = f >= milli, fp >= milli              # (u, c): per column, or per type
    allowed = canon.allowed(model[pr, pg][None, :])
    if allowed is not None:
        fits_old &= allowed[0].T
        fits_new &= allowed[0].T
    if memf is not None:  # columns are the types here
        assert tasks.gpu_memory_mib is not None
        m_old = memf[pr, pg][:, None]
        m_new = m_old - ctx.mem_req_mib[rows][pr, pg][:, None]  # the memory taken from that GPU
        fits_old &= m_old >= tasks.gpu_memory_mib[None, :]
        fits_new &= m_new >= tasks.gpu_memory_mib[None, :]
    cnt_g = cnt_c[pr] - fits_old + fits_new
    small_g = small_c[pr] - np.where(fits_old, np.int32(0), f) + np.where(fits_new, np.int32(0), fp)
    if column is not None:
        cnt_g, small_g = cnt_g[:, column], small_g[:, column]  # (u, t)
    host_after = _host_fits(cpu_free - req.cpu_milli, mem_free - req.memory_mib, tasks)
    after = _from_counts(cnt_g, small_g, total[pr] - req.gpu_milli, host_after[pr], tasks)
    scores = np.zeros(free.shape)
    scores[fit_r, fit_g] = to_score(after - before[pr], tasks)[cell_class]
    out[rows] = scores
    return np.where(ctx.gpu_fits, out, 0.0)


def node_score(ctx: FitContext, chosen: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Score of the node with the pod on the ``chosen`` GPUs.

    Parameters
    ----------
    ctx : FitContext
    chosen : ndarray of shape (m, max_gpus), bool

    Returns
    -------
    ndarray of shape (m,), float64
        In [0, 1]; 1/2 while no workload is known; 0 on infeasible nodes.
    """
    tasks, req = ctx.tasks, ctx.request
    if tasks is None:
        return np.full(chosen.shape[0], 0.5)
    out = np.zeros(chosen.shape[0])
    rows = np.flatnonzero(ctx.node_fits)
    if rows.size == 0:
        return out
    free = _usable_free(ctx, rows)
    cpu_free, mem_free = ctx.cpu_free_milli[rows], ctx.mem_host_free_mib[rows]
    free_after = np.where(chosen[rows], free - np.int32(req.gpu_milli), free)
    if tasks.gpu_memory_mib is not None and ctx.gpu_mem_free_mib is not None:
        allowed = None if ctx.gpu_model is None else tasks.allowed(ctx.gpu_model[rows])
        memf = ctx.gpu_mem_free_mib[rows]
        allowed_after = _with_memory(allowed, memf - np.where(chosen[rows], ctx.mem_req_mib[rows], 0), tasks)
        before = _fragmentation(free, cpu_free, mem_free, tasks, _with_memory(allowed, memf, tasks))
        after = _fragmentation(free_after, cpu_free - req.cpu_milli, mem_free - req.memory_mib, tasks,
                               allowed_after)
    else:
        # "Before" from the kept counts (``_RowCounts``, as ``gpu_score``); "after" counted per
        # distinct (share, mask) of the types and spread to the types (the same integers).
        model = _usable_model(ctx, rows, free.shape)
        cnt_c, small_c, canon, column = ctx.memo.slot(NAME, _RowCounts).get(ctx.rows[rows], free, model, tasks)
        before = _from_counts(cnt_c[:, column], small_c[:, column], free.sum(axis=1),
                              _host_fits(cpu_free, mem_free, tasks), tasks)
        cnt_a, small_a = _per_task(free_after, canon, canon.allowed(model))
        after = _from_counts(cnt_a[:, column], small_a[:, column], free_after.sum(axis=1),
                             _host_fits(cpu_free - req.cpu_milli, mem_free - req.memory_mib, tasks), tasks)
    out[rows] = to_score(after - before, tasks)
    return out
