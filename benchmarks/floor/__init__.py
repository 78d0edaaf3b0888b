"""A lower bound on unallocated GPU share at the 100 % point, from a cutting-stock LP.

Any placement of the pods that have arrived when the GPU demand reaches 100 % of capacity
leaves at least this much capacity unallocated, whatever the policy, online or offline.

Notes
-----
The relaxation drops everything but the GPU share: GPUs are independent bins of 1000 milli
(no nodes, CPU, host memory, GPU memory or models), a ``k``-GPU whole pod takes ``k`` whole
bins, and the bound may choose which pods fail. With fractional sizes ``r_s`` (``n_s`` pods
each), ``W_k`` whole pods of ``k`` GPUs, ``G`` GPUs, and ``a_ps`` pods of size ``s`` in bin
pattern ``p`` (``sum_s a_ps r_s <= 1000``)::

    maximize    sum_p x_p sum_s a_ps r_s + sum_k 1000 k w_k
    subject to  sum_p x_p + sum_k k w_k <= G
                sum_p a_ps x_p <= n_s            for every size s
                0 <= w_k <= W_k,  x_p >= 0

and ``unallocated >= capacity - optimum``.

With GPU models (a pod list that carries ``gpu_spec``, e.g. ``benchmarks.constrain``), the
bins come in kinds: model ``j`` has ``G_j`` GPUs, pods are grouped into classes by share (or
GPUs, for whole pods) and the models they accept, a pattern of model ``j`` holds only classes
that accept ``j``, and a whole pod takes ``k`` bins of one model it accepts::

    maximize    sum_j sum_p x_jp sum_c a_pc r_c + sum_(k,A) sum_(j in A) 1000 k w_kAj
    subject to  sum_p x_jp + sum_(k,A: j in A) k w_kAj <= G_j     for every model j
                sum_j sum_p a_pc x_jp <= n_c                       for every fractional class c
                sum_(j in A) w_kAj <= W_kA                         for every whole class (k, A)
                x, w >= 0

Pricing then runs one knapsack per model over the classes it may hold. Every GPU of a
pod list without ``gpu_spec`` is of one kind, which is the first LP.

**The work-conserving floor** (``work_conserving_floor``) is the same LP for schedulers that
place every pod some GPU can hold: they may not choose which pods fail. Pods never leave, so
free share only shrinks. Take a threshold ``theta`` and let ``a`` be the number of GPU pods
that arrive while some GPU still has ``theta`` milli free. Then, GPU share alone:

- a pod of one GPU asking ``<= theta`` that arrives before ``a`` fits on that GPU, so it is
  placed: ``n_s(<a)`` bounds pods of size ``s`` from below;
- a pod asking ``>= theta`` per GPU that arrives at or after ``a`` fits nowhere, so it fails:
  ``n_s(<a)`` and ``W_k(<a)`` bound them from above.

Every trajectory of such a scheduler satisfies these bounds for its own ``a``, so the
smallest LP optimum over ``a = 0..N`` bounds every one of them. It is found by branch and
bound over intervals of ``a``: for ``a`` in ``[lo, hi]`` the bounds of ``lo`` (below) and
``hi`` (above) relax every point, and the interval with the lowest bound is split until it is
one point. An interval whose lower bounds need more than ``G`` GPUs is infeasible. Thresholds
are the largest fractional share (a whole pod needs ``>= theta`` too) and 1000 (a whole pod
of one GPU is then bounded below); the larger of the two floors holds. On openb default the
gap from the first floor is the 810-milli pods: the first floor lets about 240 of them fail
and packs the rest, a scheduler that places them when they fit cannot.

With GPU models "some GPU has ``theta`` free" does not make a restricted pod fit, so this
floor bounds pods with a ``gpu_spec`` from above only. ``per_model`` gives every model its own
saturation point (branch and bound over the vector) and bounds them from below too.

This is the Gilmore-Gomory cutting-stock LP
(Gilmore and Gomory, "A Linear Programming Approach to the Cutting-Stock Problem",
Operations Research 9(6), 1961), solved by column generation: the pricing problem is a
bounded knapsack over the sizes with values ``r_s - y_s`` (``y_s`` the duals of the size
rows), solved exactly by dynamic programming over the capacity in steps of the sizes'
greatest common divisor. The LP optimum is an upper bound on the integer optimum, so the
result stays a valid floor. openb pods of one GPU ask for 50 to 990 milli in steps of 10.
"""

from benchmarks.floor.demand import (
    ArrivedGpuDemand,
    ModelGpuDemand,
    arrived_demand,
    arrived_gpu_pods,
    arrived_model_demand,
)
from benchmarks.floor.models import max_allocated_milli_by_model, model_pattern_lp
from benchmarks.floor.per_model import (
    PerModelFloor,
    work_conserving_floor_by_model,
    work_conserving_floor_by_model_pct,
)
from benchmarks.floor.report import (
    add_arguments,
    bundled_gpu_count,
    bundled_gpu_kinds,
    run,
    unallocated_floor_pct,
)
from benchmarks.floor.share import max_allocated_milli, pattern_lp
from benchmarks.floor.work_conserving import (
    WorkConservingFloor,
    work_conserving_floor,
    work_conserving_floor_pct,
)

__all__ = ["ArrivedGpuDemand", "ModelGpuDemand", "PerModelFloor", "WorkConservingFloor", "add_arguments", "arrived_demand",
           "arrived_gpu_pods", "arrived_model_demand", "bundled_gpu_count", "bundled_gpu_kinds",
           "max_allocated_milli", "max_allocated_milli_by_model", "model_pattern_lp", "pattern_lp", "run",
           "unallocated_floor_pct", "work_conserving_floor", "work_conserving_floor_by_model",
           "work_conserving_floor_by_model_pct", "work_conserving_floor_pct"]
