"""The cluster as arrays: nodes x GPUs.

Axes: ``n_nodes`` rows, ``max_gpus`` columns (the largest GPU count of any node; shorter
nodes are padded with ``gpu_exists == False``). Units: ``_milli`` = 1/1000 GPU or CPU core,
``_mib`` = MiB.

``ClusterState`` is the one mutable container. Kernels (``fit``, the strategies) only read
it; ``apply`` is the only writer and is called by the owner of the state (the extender's
cache) under its lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
from numpy.typing import NDArray

from scoring.journal import RowJournal
from scoring.request import ANY_MODEL_MASK, MILLI_PER_GPU, N_QOS, QoSClass, model_mask
from scoring.specs import Allocation, NodeSpec
from scoring.workload import WorkloadModel

I64 = np.int64


@dataclass(eq=False)
class ClusterState:
    """Node and GPU arrays of the whole cluster.

    Attributes
    ----------
    node_names : list of str, length n_nodes
    node_index : dict of str to int
        Row of each node name.
    models : list of str
        Model id -> model name; ``gpu_model`` holds ids.
    cpu_alloc_milli, cpu_used_milli : ndarray of shape (n_nodes,), int64
    mem_alloc_mib, mem_used_mib : ndarray of shape (n_nodes,), int64
    node_ready : ndarray of shape (n_nodes,), bool
    gpu_exists : ndarray of shape (n_nodes, max_gpus), bool
        False for padding columns.
    gpu_healthy : ndarray of shape (n_nodes, max_gpus), bool
    gpu_index : ndarray of shape (n_nodes, max_gpus), int64
        NVML device index of each column, -1 for padding.
    gpu_model : ndarray of shape (n_nodes, max_gpus), int64
        Model id, -1 for padding.
    gpu_mem_total_mib, gpu_mem_used_mib : ndarray of shape (n_nodes, max_gpus), int64
    gpu_used_milli : ndarray of shape (n_nodes, max_gpus), int64
        Allocated compute share, milli-GPU; above 1000 only when best-effort pods
        oversubscribe the GPU (``QoSPolicy.best_effort_cap_milli``).
    gpu_best_effort_milli : ndarray of shape (n_nodes, max_gpus), int64
        The part of ``gpu_used_milli`` held by best-effort pods (not reserved).
    gpu_mem_nvml_used_mib : ndarray of shape (n_nodes, max_gpus), int64
        GPU memory NVML reports in use (``GpuSpec.memory_used_mib``), MiB.
    gpu_replicas, gpu_pods : ndarray of shape (n_nodes, max_gpus), int64
        Replica slots and pods currently sharing the GPU.
    gpu_free_milli, gpu_mem_free_mib, gpu_slots_free : ndarray of shape (n_nodes, max_gpus), int64
        Derived, kept current by ``apply``: free share (``max(0, 1000 - used)``, 0 on
        padding), free memory, free replica slots. Kernels read them instead of recomputing them per request.
    node_gpu_total_milli, node_gpu_used_milli : ndarray of shape (n_nodes,), int64
        Share of all the node's GPUs (1000 x GPUs) and the allocated part.
    gpu_qos_pods : ndarray of shape (n_nodes, max_gpus, 3), int64
        Pods per QoS class (column = ``QoSClass`` value) on each GPU.
    gpu_uuid : list of list of str
        UUIDs, ``gpu_uuid[row][col]``; padding is ``""``.
    workload : WorkloadModel
        Task types of the GPU pods held, kept by ``apply`` (the ``fgd`` target workload).
    gpus_by_model : tuple of int
        Derived once in ``from_nodes`` (models and health are fixed for a state's life):
        healthy GPUs of each model id, for the cluster-wide LP of ``scoring.strategies.gap_price``.
    gpus_by_kind : tuple of (int, int, int)
        Derived with ``gpus_by_model``: ``(model id, GPUs of its node, healthy GPUs)`` for each
        kind of GPU, sorted. A pod of ``k`` GPUs can use only GPUs of nodes with ``k`` or more
        (``scoring.gaps.joint_gap_waste``).
    memory_by_kind : tuple of int
        Derived with ``gpus_by_kind``, in its order: the most memory a healthy GPU of each
        kind has, MiB. A pod asking more GPU memory (``gpufrac.io/memory``) cannot use the
        kind (``scoring.gaps.accepted_kinds``).
    row_version : ndarray of shape (n_nodes,), int64
        Bumped by every write to a row (``apply``, ``set_nvml_used_mib``): a node's terms
        computed at one version hold until it moves (``scoring.incremental``).
    version : int
        Bumped by every ``apply``: cluster-wide terms of the allocations computed at one
        version hold until it moves (``scoring.fit.cluster_terms``).
    journal : RowJournal
        The rows written, with ``row_version`` (``scoring.journal``): which moved since.
    """

    node_names: list[str]
    node_index: dict[str, int]
    models: list[str]
    cpu_alloc_milli: NDArray[np.int64]
    cpu_used_milli: NDArray[np.int64]
    mem_alloc_mib: NDArray[np.int64]
    mem_used_mib: NDArray[np.int64]
    node_ready: NDArray[np.bool_]
    gpu_exists: NDArray[np.bool_]
    gpu_healthy: NDArray[np.bool_]
    gpu_index: NDArray[np.int64]
    gpu_model: NDArray[np.int64]
    gpu_mem_total_mib: NDArray[np.int64]
    gpu_mem_used_mib: NDArray[np.int64]
    gpu_used_milli: NDArray[np.int64]
    gpu_best_effort_milli: NDArray[np.int64]
    gpu_mem_nvml_used_mib: NDArray[np.int64]
    gpu_replicas: NDArray[np.int64]
    gpu_pods: NDArray[np.int64]
    gpu_qos_pods: NDArray[np.int64]
    gpu_free_milli: NDArray[np.int64]
    gpu_mem_free_mib: NDArray[np.int64]
    gpu_slots_free: NDArray[np.int64]
    node_gpu_total_milli: NDArray[np.int64]
    node_gpu_used_milli: NDArray[np.int64]
    row_version: NDArray[np.int64]
    gpu_uuid: list[list[str]] = field(default_factory=list)
    workload: WorkloadModel = field(default_factory=WorkloadModel)
    gpus_by_model: tuple[int, ...] = ()
    gpus_by_kind: tuple[tuple[int, int, int], ...] = ()
    memory_by_kind: tuple[int, ...] = ()
    version: int = 0
    journal: RowJournal = field(default_factory=RowJournal)

    @classmethod
    def from_nodes(cls, nodes: Sequence[NodeSpec]) -> ClusterState:
        """Build an empty (nothing allocated) state.

        Parameters
        ----------
        nodes : sequence of NodeSpec
            Row order is kept; it is also the deterministic tie-break order.

        Returns
        -------
        ClusterState

        Raises
        ------
        ValueError
            On duplicate node names, duplicate UUIDs, or non-positive memory / replicas
            (GPU indices may repeat on a node: the MIG devices of one GPU share its index).
        """
        n = len(nodes)
        max_gpus = max((len(nd.gpus) for nd in nodes), default=0)
        names = [nd.name for nd in nodes]
        index = {name: i for i, name in enumerate(names)}
        if len(index) != n:
            dup = sorted({x for x in names if names.count(x) > 1})
            raise ValueError(f"duplicate node names: {dup[:5]}")
        shape = (n, max_gpus)
        state = cls(
            node_names=names,
            node_index=index,
            models=[],
            cpu_alloc_milli=np.array([nd.cpu_milli for nd in nodes], dtype=I64),
            cpu_used_milli=np.zeros(n, dtype=I64),
            mem_alloc_mib=np.array([nd.memory_mib for nd in nodes], dtype=I64),
            mem_used_mib=np.zeros(n, dtype=I64),
            node_ready=np.array([nd.ready for nd in nodes], dtype=bool),
            gpu_exists=np.zeros(shape, dtype=bool),
            gpu_healthy=np.zeros(shape, dtype=bool),
            gpu_index=np.full(shape, -1, dtype=I64),
            gpu_model=np.full(shape, -1, dtype=I64),
            gpu_mem_total_mib=np.zeros(shape, dtype=I64),
            gpu_mem_used_mib=np.zeros(shape, dtype=I64),
            gpu_used_milli=np.zeros(shape, dtype=I64),
            gpu_best_effort_milli=np.zeros(shape, dtype=I64),
            gpu_mem_nvml_used_mib=np.zeros(shape, dtype=I64),
            gpu_replicas=np.zeros(shape, dtype=I64),
            gpu_pods=np.zeros(shape, dtype=I64),
            gpu_qos_pods=np.zeros((n, max_gpus, N_QOS), dtype=I64),
            gpu_free_milli=np.zeros(shape, dtype=I64),
            gpu_mem_free_mib=np.zeros(shape, dtype=I64),
            gpu_slots_free=np.zeros(shape, dtype=I64),
            node_gpu_total_milli=np.zeros(n, dtype=I64),
            node_gpu_used_milli=np.zeros(n, dtype=I64),
            row_version=np.zeros(n, dtype=I64),
            gpu_uuid=[[""] * max_gpus for _ in range(n)],
        )
        model_id: dict[str, int] = {}
        seen_uuid: set[str] = set()
        for row, nd in enumerate(nodes):
            for g in nd.gpus:
                if g.memory_mib <= 0:
                    raise ValueError(f"node {nd.name} gpu {g.index}: memory_mib must be > 0")
                if g.replicas < 1:
                    raise ValueError(f"node {nd.name} gpu {g.index}: replicas must be >= 1")
                if g.uuid in seen_uuid:
                    raise ValueError(f"node {nd.name} gpu {g.index}: duplicate UUID {g.uuid}")
                seen_uuid.add(g.uuid)
            # Columns are positions in index order, so a node with indices {0, 2} still
            # packs into columns 0..1; ``gpu_index`` maps back. The MIG devices of one GPU
            # share its index (the inventory's rule): each is a column, in inventory order.
            for col, g in enumerate(sorted(nd.gpus, key=lambda x: x.index)):
                state.gpu_exists[row, col] = True
                state.gpu_healthy[row, col] = g.healthy
                state.gpu_index[row, col] = g.index
                state.gpu_model[row, col] = model_id.setdefault(g.model, len(model_id))
                state.gpu_mem_total_mib[row, col] = g.memory_mib
                state.gpu_mem_nvml_used_mib[row, col] = g.memory_used_mib
                state.gpu_replicas[row, col] = g.replicas
                state.gpu_uuid[row][col] = g.uuid
        state.models = list(model_id)
        state.gpu_free_milli[state.gpu_exists] = MILLI_PER_GPU
        state.gpu_mem_free_mib[:] = state.gpu_mem_total_mib
        state.gpu_slots_free[:] = state.gpu_replicas
        state.node_gpu_total_milli[:] = state.gpu_exists.sum(axis=1) * MILLI_PER_GPU
        state.gpus_by_model = tuple(
            np.bincount(state.gpu_model[state.gpu_healthy], minlength=len(state.models)).tolist())
        node_gpus = np.broadcast_to(state.gpu_exists.sum(axis=1)[:, None], shape)
        kinds: Counter[tuple[int, int]] = Counter()
        most: dict[tuple[int, int], int] = {}
        healthy = state.gpu_healthy
        for kind, mib in zip(zip(state.gpu_model[healthy].tolist(), node_gpus[healthy].tolist(), strict=True),
                             state.gpu_mem_total_mib[healthy].tolist(), strict=True):
            kinds[kind] += 1
            most[kind] = max(most.get(kind, 0), mib)
        state.gpus_by_kind = tuple(sorted((m, n, c) for (m, n), c in kinds.items()))
        state.memory_by_kind = tuple(most[(m, n)] for m, n, _ in state.gpus_by_kind)
        return state

    @property
    def n_nodes(self) -> int:
        """Number of node rows."""
        return len(self.node_names)

    @property
    def max_gpus(self) -> int:
        """Number of GPU columns."""
        return int(self.gpu_exists.shape[1])

    def model_ids(self, names: Iterable[str]) -> frozenset[int]:
        """Model ids for model names; unknown names are dropped (no node has them)."""
        lookup = {m: i for i, m in enumerate(self.models)}
        return frozenset(lookup[m] for m in names if m in lookup)

    def model_mask_from(self, mask: int, models: Sequence[str]) -> int:
        """Another state's model mask (``models``: that state's model list) in this state's ids;
        names this state lacks are dropped, ``ANY_MODEL_MASK`` stays."""
        if mask == ANY_MODEL_MASK:
            return mask
        return model_mask(self.model_ids(m for j, m in enumerate(models) if j < 63 and mask >> j & 1))

    def apply(self, alloc: Allocation, sign: int = 1) -> None:
        """Add (``sign=1``) or remove (``sign=-1``) one pod's allocation.

        Parameters
        ----------
        alloc : Allocation
        sign : {1, -1}

        Raises
        ------
        KeyError
            If the node is unknown.
        ValueError
            If a GPU column does not exist on the node or is listed twice, the memory amounts
            are not one per column, or removing would drive a counter below zero (a double
            release). Nothing is changed then.
        """
        row = self.node_index[alloc.node]
        cols = alloc.gpu_cols
        # Per GPU in plain Python: an allocation holds one to eight GPUs, where numpy's
        # fancy indexing costs more than the arithmetic (a start-up accounts every pod).
        if (len(set(cols)) != len(cols) or len(alloc.gpu_memory_mib) != len(cols)
                or not all(0 <= c < self.max_gpus and self.gpu_exists[row, c] for c in cols)):
            raise ValueError(f"node {alloc.node}: no GPU column among {alloc.gpu_cols}, a column listed "
                             f"twice, or not one memory amount per column")
        if sign == -1:
            if (
                self.cpu_used_milli[row] < alloc.cpu_milli
                or self.mem_used_mib[row] < alloc.memory_mib
                or any(self.gpu_pods[row, c] < 1 for c in cols)
            ):
                raise ValueError(f"node {alloc.node}: release of an allocation it does not hold")
        elif sign != 1:
            raise ValueError(f"sign must be 1 or -1, got {sign}")
        self.row_version[row] += 1
        self.journal.wrote(row)
        self.version += 1
        self.cpu_used_milli[row] += sign * alloc.cpu_milli
        self.mem_used_mib[row] += sign * alloc.memory_mib
        if cols:
            milli, qos = sign * alloc.gpu_milli, int(alloc.qos)
            best_effort = alloc.qos == QoSClass.BEST_EFFORT
            for c, mem in zip(cols, alloc.gpu_memory_mib, strict=True):
                used = int(self.gpu_used_milli[row, c]) + milli
                self.gpu_used_milli[row, c] = used
                self.gpu_free_milli[row, c] = max(MILLI_PER_GPU - used, 0)
                if best_effort:
                    self.gpu_best_effort_milli[row, c] += milli
                self.gpu_mem_used_mib[row, c] += sign * mem
                self.gpu_mem_free_mib[row, c] -= sign * mem
                self.gpu_pods[row, c] += sign
                self.gpu_slots_free[row, c] -= sign
                self.gpu_qos_pods[row, c, qos] += sign
            self.node_gpu_used_milli[row] += milli * len(cols)
            if alloc.in_workload:
                self.workload.add((len(cols), alloc.gpu_milli, alloc.cpu_milli, alloc.memory_mib,
                                   alloc.model_mask, alloc.gpu_memory_request_mib), sign)

    def set_nvml_used_mib(self, row: int, used_mib: Sequence[int]) -> None:
        """Set the GPU memory NVML reports in use on one node (an agent heartbeat).

        Parameters
        ----------
        row : int
        used_mib : sequence of int
            MiB per GPU column of the row, in column (device index) order.
        """
        self.gpu_mem_nvml_used_mib[row, : len(used_mib)] = used_mib
        self.row_version[row] += 1
        self.journal.wrote(row)

    def copy(self) -> ClusterState:
        """Deep copy (arrays copied), for snapshots and what-if evaluation."""
        return self.rows_copy(np.arange(self.n_nodes, dtype=I64), workload=self.workload.copy())

    def rows_copy(self, rows: NDArray[np.int64], workload: WorkloadModel | None = None) -> ClusterState:
        """A state of only ``rows`` (arrays copied), for what-if checks on a few nodes.

        Parameters
        ----------
        rows : ndarray of shape (k,), int64
            Rows to keep, in the new state's order.
        workload : WorkloadModel, optional
            The copy's workload; a new empty one by default (``apply`` on the copy then
            never touches this state's).

        Returns
        -------
        ClusterState
            ``k`` nodes; models, GPU columns, ``gpus_by_model``, ``gpus_by_kind`` and
            ``memory_by_kind`` as in this state.
        """
        names = [self.node_names[r] for r in rows.tolist()]
        arrays = {f.name: getattr(self, f.name)[rows] for f in fields(self)
                  if isinstance(getattr(self, f.name), np.ndarray)}
        return ClusterState(
            node_names=names,
            node_index={n: i for i, n in enumerate(names)},
            models=list(self.models),
            gpu_uuid=[list(self.gpu_uuid[r]) for r in rows.tolist()],
            workload=workload if workload is not None else WorkloadModel(),
            gpus_by_model=self.gpus_by_model,
            gpus_by_kind=self.gpus_by_kind,
            memory_by_kind=self.memory_by_kind,
            **arrays,
        )
