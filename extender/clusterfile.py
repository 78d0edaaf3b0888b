"""Standalone mode's node list: a YAML or JSON file, or a CSV such as openb's node list.

CSV columns (openb ``openb_node_list_gpu_node.csv`` loads as is)::

    sn,cpu_milli,memory_mib,gpu,model

GPU memory comes from ``OPENB_GPU_MEMORY_MIB`` (the trace has none), UUIDs are derived from
the node name (``GPU-<uuid5>``), replica slots from ``replicas_per_gpu``.

YAML::

    nodes:
    - name: node-a
      cpu_milli: 64000
      memory_mib: 262144
      gpus:            # entries of the gpufrac.io/inventory v1 "gpus" list
      - {index: 0, uuid: GPU-..., model: T4, memory_mib: 15360, replicas: 4}

JSON: the same document (``{"nodes": [...]}``); the fast form for thousands of nodes.
"""

from __future__ import annotations

import csv
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from podspec.annotations import GpuInventory
from scoring.specs import GpuSpec, NodeSpec

OPENB_GPU_MEMORY_MIB = {
    "T4": 16 * 1024,
    "P100": 16 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
    "A10": 24 * 1024,
    # Undisclosed in the trace. Assumed: G2 16 GiB (the 8-GPU workhorse, priced between T4 and
    # V100 class), G3 32 GiB (the newer 8-GPU generation). openb pods carry no memory request,
    # so the assumption only sets the default memory of a share (fraction x total).
    "G2": 16 * 1024,
    "G3": 32 * 1024,
}
"""GPU memory assumed per openb model, MiB."""

_UUID_NS = uuid.UUID("6f1d6c1e-0b7a-4d0e-9a51-6770756672ac")


def synthetic_uuid(node: str, index: int) -> str:
    """Deterministic NVML-style UUID for a GPU of a file-defined node."""
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{node}/{index}"))


class _FileNode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    cpu_milli: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    gpus: list[GpuInventory] = Field(default_factory=list)


class _ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[_FileNode]


def load_cluster_file(path: Path, *, replicas_per_gpu: int = 20) -> list[NodeSpec]:
    """Load a node list.

    Parameters
    ----------
    path : Path
        ``.csv`` (openb columns), ``.yaml``/``.yml`` or ``.json`` (the same document as the
        YAML form). YAML is read by libyaml's C loader when PyYAML has it, JSON by
        pydantic-core straight from bytes: a 5,000-node file loads in seconds.
    replicas_per_gpu : int
        Replica slots per GPU for CSV files.

    Returns
    -------
    list of NodeSpec

    Raises
    ------
    ValueError
        Unknown extension, missing CSV columns, unknown model without memory, or an invalid
        YAML or JSON entry (with its field path).
    """
    if path.suffix == ".csv":
        return _load_csv(path, replicas_per_gpu)
    if path.suffix in (".yaml", ".yml"):
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        raw: Any = yaml.load(path.read_bytes(), Loader=loader)  # noqa: S506 - a safe loader
        return _load_document(path, lambda: _ClusterFile.model_validate(raw))
    if path.suffix == ".json":
        data = path.read_bytes()
        return _load_document(path, lambda: _ClusterFile.model_validate_json(data))
    raise ValueError(f"{path}: cluster file must be .csv, .yaml or .json")


def _load_csv(path: Path, replicas: int) -> list[NodeSpec]:
    out = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        need = {"sn", "cpu_milli", "memory_mib", "gpu", "model"}
        if not need <= set(reader.fieldnames or ()):
            raise ValueError(f"{path}: CSV needs columns {sorted(need)}, has {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            name, model, n_gpu = row["sn"], row["model"], int(row["gpu"] or 0)
            if n_gpu and model not in OPENB_GPU_MEMORY_MIB:
                raise ValueError(f"{path}:{line}: model {model!r} has no known memory size")
            gpus = tuple(
                GpuSpec(i, synthetic_uuid(name, i), model, OPENB_GPU_MEMORY_MIB[model], replicas)
                for i in range(n_gpu)
            )
            out.append(NodeSpec(name, int(row["cpu_milli"]), int(row["memory_mib"]), gpus))
    return out


def _load_document(path: Path, validate: Callable[[], _ClusterFile]) -> list[NodeSpec]:
    """The nodes of a YAML or JSON cluster file, every invalid entry named by its field path."""
    try:
        parsed = validate()
    except ValidationError as exc:
        raise ValueError(f"{path}: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())) from None
    return [
        NodeSpec(n.name, n.cpu_milli, n.memory_mib, tuple(
            GpuSpec(g.index, g.uuid, g.model, g.memory_mib, g.replicas, g.healthy) for g in n.gpus))
        for n in parsed.nodes
    ]
