"""One pod's GPU request, as the placement core sees it.

The wire format (annotations, Kubernetes quantities) is parsed in ``podspec.pods``;
this module only holds the already-validated numbers. Units: GPU share in milli-GPU
(1000 = one whole GPU), memory in MiB, CPU in milli-cores.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MILLI_PER_GPU = 1000
"""Compute share of one whole GPU, in milli-GPU."""


class QoSClass(enum.IntEnum):
    """Tenant QoS class of a GPU pod; the integer is the column in ``gpu_qos_pods``.

    Lower value = stronger guarantee. ``GUARANTEED`` reserves share and memory,
    ``BURSTABLE`` reserves share, ``BEST_EFFORT`` fills leftovers.
    """

    GUARANTEED = 0
    BURSTABLE = 1
    BEST_EFFORT = 2

    @property
    def wire_name(self) -> str:
        """Annotation spelling: ``guaranteed``, ``burstable``, ``best-effort``."""
        return self.name.lower().replace("_", "-")


N_QOS = len(QoSClass)


@dataclass(frozen=True, slots=True)
class QoSPolicy:
    """What each QoS class may share, enforced by ``scoring.fit`` (admin config ``qos:``).

    Share rules per GPU, with ``used`` the share allocated to every pod there, ``reserved``
    the part held by guaranteed and burstable pods, ``req`` the pod's share (milli-GPU):

    ============  ====================================================================
    guaranteed    ``used + req <= 1000`` (never oversubscribed); with
                  ``isolate_guaranteed``, no best-effort pod on the GPU; memory counts
                  the larger of the allocated and the NVML-used memory
    burstable     ``reserved + req <= 1000``; and ``used + req <= 1000`` on a GPU that
                  holds a guaranteed pod (a guaranteed pod's GPU is never oversubscribed)
    best-effort   ``used + req <= best_effort_cap_milli`` (``1000`` on a GPU holding a
                  guaranteed pod); with ``isolate_guaranteed``, never on a GPU holding one
    ============  ====================================================================

    Parameters
    ----------
    isolate_guaranteed : bool
        Guaranteed and best-effort pods never share a GPU.
    best_effort_cap_milli : int
        How much share best-effort pods may fill a GPU up to, milli-GPU in [1000, 4000]
        (1000 x the oversubscription factor; 1000 = no oversubscription).

    Raises
    ------
    ValueError
        If ``best_effort_cap_milli`` is out of range.
    """

    isolate_guaranteed: bool = False
    best_effort_cap_milli: int = MILLI_PER_GPU

    def __post_init__(self) -> None:
        if not MILLI_PER_GPU <= self.best_effort_cap_milli <= 4 * MILLI_PER_GPU:
            raise ValueError(
                f"best_effort_cap_milli: must be in [1000, 4000], got {self.best_effort_cap_milli}")


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks of one node.

    Parameters
    ----------
    gpu_count : int
        Number of GPUs the pod uses (``gpufrac.io/gpu``), >= 0. 0 means a CPU-only pod.
    gpu_milli : int
        Compute share per GPU in milli-GPU, in [1, 1000]; below 1000 only when
        ``gpu_count == 1``. Ignored when ``gpu_count == 0``.
    gpu_memory_mib : int or None
        GPU memory per GPU in MiB; ``None`` means ``floor(gpu_milli * memory_total_mib / 1000)``
        of whichever GPU is chosen.
    allowed_models : frozenset of int or None
        Model ids (``ClusterState.models`` positions) the pod accepts; ``None`` = any.
    qos : QoSClass
        Tenant QoS class.
    cpu_milli : int
        CPU request of the whole pod in milli-cores, >= 0.
    memory_mib : int
        Host memory request of the whole pod in MiB, >= 0.

    Raises
    ------
    ValueError
        If the numbers are out of range (validation happens once, at construction).
    """

    gpu_count: int
    gpu_milli: int = MILLI_PER_GPU
    gpu_memory_mib: int | None = None
    allowed_models: frozenset[int] | None = None
    qos: QoSClass = QoSClass.BURSTABLE
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.gpu_count < 0:
            raise ValueError(f"gpu_count: must be >= 0, got {self.gpu_count}")
        if not 1 <= self.gpu_milli <= MILLI_PER_GPU:
            raise ValueError(f"gpu_milli: must be in [1, 1000], got {self.gpu_milli}")
        if self.gpu_count > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise ValueError(f"gpu_milli: must be 1000 when gpu_count > 1, got {self.gpu_milli}")
        if self.gpu_memory_mib is not None and self.gpu_memory_mib < 0:
            raise ValueError(f"gpu_memory_mib: must be >= 0, got {self.gpu_memory_mib}")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("cpu_milli and memory_mib: must be >= 0")

    @property
    def is_gpu(self) -> bool:
        """True when the pod uses at least one GPU."""
        return self.gpu_count > 0

    @property
    def is_whole(self) -> bool:
        """True when every GPU of the pod is used whole (never shared)."""
        return self.gpu_milli == MILLI_PER_GPU


ANY_MODEL_MASK = -1
"""``model_mask`` of a pod that accepts any GPU model (every bit set)."""


def model_mask(allowed_models: frozenset[int] | None) -> int:
    """The allowed model ids as a bit mask: bit ``j`` set when model id ``j`` is allowed.

    Parameters
    ----------
    allowed_models : frozenset of int or None
        ``PodRequest.allowed_models``.

    Returns
    -------
    int
        ``ANY_MODEL_MASK`` for None, or when an id is past 62 (a cluster with more than 63
        GPU models: the workload model then treats the pod as accepting any model).
    """
    if allowed_models is None or any(m > 62 for m in allowed_models):
        return ANY_MODEL_MASK
    return sum(1 << m for m in allowed_models)

