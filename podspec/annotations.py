"""Names gpufrac reads and writes on Kubernetes objects, and the versioned node inventory.

This module is the one contract shared by the extender and the node agent: the agent
publishes ``NodeInventory`` as the ``gpufrac.io/inventory`` node annotation; the extender
parses it with ``parse_inventory``. The JSON Schema of version 1 is committed at
``podspec/schemas/inventory.v1.json`` and generated from ``NodeInventory`` (a test keeps
the two equal).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DOMAIN = "gpufrac.io"
RESOURCE_GPU = f"{DOMAIN}/gpu"
"""Extended resource: number of GPUs a pod uses; nodes advertise their replica slots."""

FRACTION = f"{DOMAIN}/fraction"
MEMORY = f"{DOMAIN}/memory"
GPU_MODEL = f"{DOMAIN}/gpu-model"
QOS = f"{DOMAIN}/qos"
POD_ANNOTATIONS = (FRACTION, MEMORY, GPU_MODEL, QOS)
"""Pod annotations a user may set."""

ASSIGNED_GPUS = f"{DOMAIN}/assigned-gpus"
ASSIGNED_FRACTION = f"{DOMAIN}/assigned-fraction"
ASSIGNED_MEMORY = f"{DOMAIN}/assigned-memory"
ASSIGNED_AT = f"{DOMAIN}/assigned-at"
"""Pod annotations gpufrac writes at bind (the allocation record)."""

REQUEUE = f"{DOMAIN}/requeue"
"""Pod annotation gpufrac bumps on pending GPU pods when GPU share is freed (see extender.cluster)."""

INVENTORY = f"{DOMAIN}/inventory"
"""Node annotation holding the JSON ``NodeInventory``."""

MAX_GPUS_PER_NODE = 64
"""Most GPUs (or MIG devices) one node's inventory may list; also the most a pod may ask for."""

MAX_GPU_MEMORY_MIB = 2**24
"""Largest memory of one GPU, MiB (16 TiB): bounds inventory values and pod requests."""

INVENTORY_SCHEMA_V1: Final = "gpufrac.io/inventory/v1"
SCHEMA_PATH = Path(__file__).with_name("schemas") / "inventory.v1.json"


class PodGpuUsage(BaseModel):
    """GPU memory the processes of one pod use on one GPU (NVML, mapped by cgroup)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uid: Annotated[str, Field(min_length=1, max_length=64, description="pod UID")]
    memory_used_mib: Annotated[int, Field(ge=0, le=MAX_GPU_MEMORY_MIB)]


class GpuInventory(BaseModel):
    """One GPU as the agent sees it through NVML."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: Annotated[int, Field(ge=0, le=4095, description="NVML device index")]
    uuid: Annotated[str, Field(min_length=1, max_length=128, description="NVML UUID")]
    model: Annotated[
        str, Field(min_length=1, max_length=64, description="model name matched by gpufrac.io/gpu-model")
    ]
    memory_mib: Annotated[int, Field(gt=0, le=MAX_GPU_MEMORY_MIB, description="total GPU memory, MiB")]
    memory_used_mib: Annotated[
        int, Field(ge=0, le=MAX_GPU_MEMORY_MIB, description="NVML memory used, MiB")] = 0
    replicas: Annotated[
        int, Field(ge=1, le=1000, description="time-slicing replica slots: pods that may share it")
    ] = 1
    healthy: bool = True
    health_reason: Annotated[
        str, Field(max_length=256, description="why unhealthy, e.g. 'XID 79'")
    ] = ""
    utilization_pct: Annotated[int, Field(ge=0, le=100, description="NVML GPU utilization, %")] = 0
    mig_parent: Annotated[
        str, Field(max_length=128, description="for a MIG device: the UUID of its GPU; else empty")
    ] = ""
    pods: Annotated[
        list[PodGpuUsage], Field(max_length=256, description="GPU memory really used, per pod")
    ] = Field(default_factory=list)


class NodeInventory(BaseModel):
    """Version 1 of the ``gpufrac.io/inventory`` node annotation."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="gpufrac node inventory v1")

    schema_: Annotated[Literal["gpufrac.io/inventory/v1"], Field(alias="schema")] = (
        INVENTORY_SCHEMA_V1
    )
    node: Annotated[str, Field(min_length=1, max_length=253)]
    heartbeat: Annotated[datetime, Field(description="when the agent last read NVML (RFC 3339)")]
    gpus: Annotated[list[GpuInventory], Field(max_length=MAX_GPUS_PER_NODE)]


def inventory_json_schema() -> dict[str, object]:
    """JSON Schema of ``NodeInventory`` (the committed ``inventory.v1.json``)."""
    return NodeInventory.model_json_schema(by_alias=True)


def parse_inventory(text: str) -> NodeInventory:
    """Parse and validate a ``gpufrac.io/inventory`` annotation value.

    Parameters
    ----------
    text : str
        The annotation value (JSON).

    Returns
    -------
    NodeInventory

    Raises
    ------
    ValueError
        With the field path of every problem, e.g. ``gpus.0.memory_mib: Input should be
        greater than 0``; also on duplicate UUIDs, or duplicate indices among whole GPUs.
    """
    try:
        inv = NodeInventory.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"{INVENTORY}: {problems}") from None
    # MIG devices share their GPU's index; whole GPUs must not.
    indices = [g.index for g in inv.gpus if not g.mig_parent]
    uuids = [g.uuid for g in inv.gpus]
    if len(set(indices)) != len(indices) or len(set(uuids)) != len(uuids):
        raise ValueError(f"{INVENTORY}: duplicate GPU index or UUID")
    return inv


def dump_inventory(inv: NodeInventory) -> str:
    """Serialize an inventory for the annotation (compact JSON, ``schema`` key spelled out)."""
    return json.dumps(inv.model_dump(mode="json", by_alias=True), separators=(",", ":"))
