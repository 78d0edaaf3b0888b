"""Mixed-memory openb: GPUs of 16, 24, 32 and 80 GiB, and pods that ask for GPU memory.

openb pods ask for no GPU memory and its GPUs' sizes are not in the trace, so memory never
constrains the published replays. This module builds the case where it does:

- **Nodes** (``mixed_memory_nodes``): the openb node list with each model's GPUs given the
  memory of ``MIXED_MEMORY_MIB`` (T4, P100 and V100M16 16 GiB, A10 and G2 24 GiB, V100M32
  32 GiB, G3 80 GiB): one cluster with four memory sizes.
- **Pods** (``request_memory``): a stated share of the GPU pods, chosen uniformly at random
  with the rule's own seed, ask ``gpufrac.io/memory`` per GPU: their share of a 16 GiB GPU
  times a factor ``exp(N(0, 0.5))`` clipped to [1/4, 3] (median 1, one pod in ten at 1.9 or
  more, as inference pods hold a model's weights whatever compute they ask), at least 512 MiB, and
  rounded down to what the largest GPU of some model the pod's node could be holds (so every
  pod fits somewhere: a pod of ``k`` GPUs needs a node with ``k`` GPUs of that size).

A variant is named ``<openb variant>-g<percent>`` (``default-g30``: 30 % of the GPU pods ask
for memory, on the mixed-memory node list); ``python -m benchmarks replay --gpu-memory mixed
--memory-requests 30`` does the same for any pod list.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks import constrain
from benchmarks.trace import TracePod
from scoring.specs import NodeSpec

GIB = 1024

MIXED_MEMORY_MIB = {"T4": 16 * GIB, "P100": 16 * GIB, "V100M16": 16 * GIB, "A10": 24 * GIB, "G2": 24 * GIB,
                    "V100M32": 32 * GIB, "G3": 80 * GIB}
"""GPU memory per openb model on the mixed-memory cluster, MiB."""

SPREAD = 0.5
"""Standard deviation of the log of a pod's memory factor."""

FACTOR_RANGE = (0.25, 3.0)
"""A pod's memory factor is clipped to this range."""

MIN_REQUEST_MIB = 512

def parse_variant(name: str) -> tuple[str, float]:
    """``default-g30`` -> ``("default", 30.0)``; any other name -> ``(name, 0.0)``.

    Raises
    ------
    ValueError
        For a percentage above 100.
    """
    return constrain.parse_suffix(name, "g")


def mixed_memory_nodes(nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
    """The same nodes with ``MIXED_MEMORY_MIB`` per GPU (models not listed keep theirs)."""
    return [replace(n, gpus=tuple(replace(g, memory_mib=MIXED_MEMORY_MIB.get(g.model, g.memory_mib))
                                  for g in n.gpus)) for n in nodes]


def write_cluster_file(nodes: Sequence[NodeSpec], path: Path) -> Path:
    """Write ``nodes`` as a JSON cluster file (``extender.clusterfile.load_cluster_file``)."""
    doc = {"nodes": [{"name": n.name, "cpu_milli": n.cpu_milli, "memory_mib": n.memory_mib,
                      "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib,
                                "replicas": g.replicas, "healthy": g.healthy} for g in n.gpus]}
                     for n in nodes]}
    path.write_text(json.dumps(doc))
    return path


def request_memory(pods: Sequence[TracePod], pct: float, nodes: Sequence[NodeSpec], seed: int = 0) -> list[TracePod]:
    """Give ``pct`` % of the GPU pods an explicit GPU memory request (module notes).

    Parameters
    ----------
    pods : sequence of TracePod
        An openb pod list, in its order.
    pct : float
        Share of the GPU pods, percent in [0, 100].
    nodes : sequence of NodeSpec
        The cluster the pods will run on (``mixed_memory_nodes``): a request never exceeds
        the largest GPU a node that could hold the pod has.
    seed : int
        The rule's own seed.

    Returns
    -------
    list of TracePod
        The same pods; chosen ones have ``gpu_memory_mib`` > 0.

    Raises
    ------
    ValueError
        If ``pct`` is outside [0, 100].
    """
    rng, chosen = constrain.pick_pods(pods, pct, seed, lambda p: bool(p.num_gpu and not p.gpu_memory_mib))
    out = list(pods)
    for i in chosen:
        p = out[i]
        cap = max((min(g.memory_mib for g in n.gpus) for n in nodes
                   if len(n.gpus) >= p.num_gpu and n.cpu_milli >= p.cpu_milli and n.memory_mib >= p.memory_mib
                   and n.gpus and (not p.gpu_spec or any(g.model in p.gpu_spec.split("|") for g in n.gpus))),
                  default=0)
        if cap == 0:
            continue
        factor = min(max(math.exp(float(rng.normal(0.0, SPREAD))), FACTOR_RANGE[0]), FACTOR_RANGE[1])
        want = min(p.gpu_milli, 1000) / 1000 * 16 * GIB * factor
        out[i] = replace(p, gpu_memory_mib=int(min(max(want, MIN_REQUEST_MIB), cap)))
    return out
