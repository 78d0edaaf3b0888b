"""What a ``ClusterState`` is built from and what it counts: the nodes, their GPUs, and the
allocations of pods to them (``ClusterState.from_nodes``, ``ClusterState.apply``).

Units: ``_milli`` = 1/1000 GPU or CPU core, ``_mib`` = MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from scoring.request import ANY_MODEL_MASK, QoSClass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One physical GPU (or, later, one MIG device) as a placement unit.

    Parameters
    ----------
    index : int
        Device index on the node (NVML index), >= 0; the MIG devices of one GPU share it.
    uuid : str
        NVML UUID (``GPU-...``), unique in the cluster.
    model : str
        Model name (``T4``, ``V100M32``...), compared exactly against ``gpufrac.io/gpu-model``.
    memory_mib : int
        Total GPU memory in MiB, > 0.
    replicas : int
        Time-slicing replica slots: how many pods may share this GPU, >= 1.
    healthy : bool
        False once NVML reports a fatal XID or the GPU is lost; such a GPU is never chosen.
    memory_used_mib : int
        GPU memory NVML reports in use, MiB (the inventory's ``memory_used_mib``): counted
        against the memory headroom of guaranteed pods (``scoring.request.QoSPolicy``).
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    replicas: int = 1
    healthy: bool = True
    memory_used_mib: int = 0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node's allocatable CPU, memory and GPUs.

    Parameters
    ----------
    name : str
        Kubernetes node name.
    cpu_milli : int
        Allocatable CPU in milli-cores.
    memory_mib : int
        Allocatable host memory in MiB.
    gpus : tuple of GpuSpec
        The node's GPUs, in index order (may be empty: a CPU-only node).
    ready : bool
        False makes every GPU pod infeasible here (reason ``NODE_NOT_READY``), e.g. when the
        node's inventory is stale.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...] = ()
    ready: bool = True


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one pod holds on one node; ``ClusterState.apply`` adds or removes it.

    Parameters
    ----------
    node : str
        Node name.
    gpu_cols : tuple of int
        Columns of the GPUs used in the node's row (see ``ClusterState.gpu_index`` for
        device indices); empty for a CPU-only pod.
    gpu_milli : int
        Share per GPU in milli-GPU.
    gpu_memory_mib : tuple of int
        Memory per GPU in MiB, one entry per ``gpu_cols`` entry (already resolved for
        proportional requests).
    qos : QoSClass
        The pod's QoS class.
    cpu_milli, memory_mib : int
        Host CPU (milli-cores) and memory (MiB) of the pod.
    model_mask : int
        The GPU models the pod accepts (``scoring.request.model_mask``); counted in the
        ``workload`` so fragmentation knows which GPUs each task type can use.
    in_workload : bool
        Whether the allocation is demand the ``workload`` learns from (True for what
        gpufrac placed; False for capacity held by an allocation it did not make).
    gpu_memory_request_mib : int
        The pod's explicit GPU memory per GPU (``PodRequest.gpu_memory_mib``), MiB; 0 when it
        asked for its share's proportion. Counted in the ``workload``, so that fragmentation
        knows which GPUs' free memory each task type can use.
    """

    node: str
    gpu_cols: tuple[int, ...]
    gpu_milli: int
    gpu_memory_mib: tuple[int, ...]
    qos: QoSClass
    cpu_milli: int
    memory_mib: int
    model_mask: int = ANY_MODEL_MASK
    in_workload: bool = True
    gpu_memory_request_mib: int = 0
