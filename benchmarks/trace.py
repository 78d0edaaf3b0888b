"""The openb trace: pods as the paper replays them (Weng et al., USENIX ATC '23, section 6).

Pods are sorted by name, shuffled with the seed, then clones drawn uniformly with
replacement from the original pods are appended until the total GPU request reaches
``target`` (1.3) times the cluster's GPU capacity.
"""

from __future__ import annotations

import csv
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

TRACE_DIR = Path(__file__).with_name("traces") / "openb"
DEFAULT_NODES = TRACE_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = TRACE_DIR / "openb_pod_list_default.csv"

QOS_FROM_TRACE = {"LS": "guaranteed", "Guaranteed": "guaranteed", "Burstable": "burstable",
                  "BE": "best-effort"}
"""openb QoS -> gpufrac.io/qos (LS, latency-sensitive, is gpufrac's guaranteed)."""

_UID_NS = uuid.UUID("0b1e8c1a-8f51-4a51-9b8e-6f70656e6221")


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of the trace (or a clone)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    qos: str
    gpu_memory_mib: int = 0
    """Explicit GPU memory per GPU (``gpufrac.io/memory``), MiB; 0: none (every openb list)."""
    lifetime_s: int = 0
    """``deletion_time - creation_time`` of the trace, seconds (at least 1; 0 when the list has
    no times). Only the churn replay (``benchmarks.churn``) reads it."""

    @property
    def gpu_request_milli(self) -> int:
        """Total GPU share the pod asks for."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    def pod_object(self, seed: int, namespace: str = "openb") -> dict[str, Any]:
        """The pending Pod JSON kube-scheduler would see for this pod."""
        annotations: dict[str, str] = {"gpufrac.io/qos": QOS_FROM_TRACE.get(self.qos, "burstable")}
        if self.num_gpu and self.gpu_milli < 1000:
            annotations["gpufrac.io/fraction"] = f"{self.gpu_milli / 1000:g}"
        if self.gpu_spec:
            annotations["gpufrac.io/gpu-model"] = self.gpu_spec
        if self.num_gpu and self.gpu_memory_mib:
            annotations["gpufrac.io/memory"] = f"{self.gpu_memory_mib}Mi"
        resources: dict[str, dict[str, str]] = {
            "requests": {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"}}
        if self.num_gpu:
            resources["limits"] = {"gpufrac.io/gpu": str(self.num_gpu)}
            resources["requests"]["gpufrac.io/gpu"] = str(self.num_gpu)
        return {
            "metadata": {"name": self.name, "namespace": namespace,
                         "uid": str(uuid.uuid5(_UID_NS, f"{seed}/{self.name}")),
                         "annotations": annotations},
            "spec": {"schedulerName": "gpufrac-scheduler",
                     "containers": [{"name": "main", "image": "registry.invalid/openb:0",
                                     "resources": resources}]},
            "status": {"phase": "Pending"},
        }


def load_pods(path: Path) -> list[TracePod]:
    """Read an openb pod list (full or five-column multigpu files), sorted by name."""
    out = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            n = int(row["num_gpu"])
            created, deleted = row.get("creation_time") or "", row.get("deletion_time") or ""
            lifetime = max(1, int(deleted) - int(created)) if created and deleted else 0
            out.append(TracePod(row["name"], int(row["cpu_milli"]), int(row["memory_mib"]), n,
                                int(row["gpu_milli"]) if n else 0, row.get("gpu_spec") or "",
                                row.get("qos") or "Burstable", lifetime_s=lifetime))
    return sorted(out, key=lambda p: p.name)


def arrival_sequence(pods: list[TracePod], seed: int, capacity_milli: int,
                     target: float = 1.3) -> list[TracePod]:
    """Shuffle with ``seed`` and append clones up to ``target`` x capacity of GPU request.

    Clone names are ``<original>-clone-<i>`` so a placement traces back to its original.
    """
    rng = np.random.default_rng(seed)
    seq = [pods[i] for i in rng.permutation(len(pods))]
    total = sum(p.gpu_request_milli for p in seq)
    i = 0
    while total < target * capacity_milli:
        src = pods[int(rng.integers(len(pods)))]
        clone = replace(src, name=f"{src.name}-clone-{i}")
        seq.append(clone)
        total += clone.gpu_request_milli
        i += 1
    return seq
