"""Independent feasibility check of a replay's placements CSV.

Written without the placement core (plain Python over the input files) so that it cannot
share a bug with it. Checks: every placed pod exists in the trace (clones by name prefix),
GPU count matches ``num_gpu``, no GPU above 1000 milli, whole-GPU pods alone on their GPUs,
``gpu_spec`` models respected, no node over CPU or memory, no GPU over its replica slots.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path


def check(nodes_csv: Path, pods_csv: Path, placements_csv: Path, *, replicas_per_gpu: int = 20) -> list[str]:
    """Return one line per violation (empty when feasible)."""
    nodes = {r["sn"]: r for r in csv.DictReader(nodes_csv.open(newline=""))}
    pods = {r["name"]: r for r in csv.DictReader(pods_csv.open(newline=""))}
    gpu_milli: dict[tuple[str, int], int] = defaultdict(int)
    gpu_pods: dict[tuple[str, int], int] = defaultdict(int)
    gpu_whole: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    problems: list[str] = []
    seen: set[str] = set()
    for row in csv.DictReader(placements_csv.open(newline="")):
        name = row["pod_name"]
        if name in seen:
            problems.append(f"{name}: placed twice")
        seen.add(name)
        src = pods.get(name.split("-clone-")[0])
        node = nodes.get(row["node"])
        if src is None or node is None:
            problems.append(f"{name}: unknown pod or node {row['node']}")
            continue
        idx = [int(i) for i in row["gpu_indices"].split("|") if i != ""]
        want = int(src["num_gpu"])
        milli = int(row["gpu_milli"])
        if len(idx) != want or len(set(idx)) != len(idx):
            problems.append(f"{name}: {len(idx)} distinct GPUs, trace asks {want}")
        if want and milli != int(src["gpu_milli"]):
            problems.append(f"{name}: gpu_milli {milli}, trace asks {src['gpu_milli']}")
        spec = src.get("gpu_spec") or ""
        if want and spec and node["model"] not in spec.split("|"):
            problems.append(f"{name}: model {node['model']} not in {spec}")
        for i in idx:
            if not 0 <= i < int(node["gpu"]):
                problems.append(f"{name}: GPU {i} not on {row['node']}")
            gpu_milli[(row["node"], i)] += milli
            gpu_pods[(row["node"], i)] += 1
            gpu_whole[(row["node"], i)] += milli == 1000
        cpu[row["node"]] += int(src["cpu_milli"])
        mem[row["node"]] += int(src["memory_mib"])
    for key, used in gpu_milli.items():
        if used > 1000:
            problems.append(f"GPU {key}: {used} milli > 1000")
        if gpu_whole[key] and gpu_pods[key] > 1:
            problems.append(f"GPU {key}: whole-GPU pod shares with {gpu_pods[key] - 1} pod(s)")
        if gpu_pods[key] > replicas_per_gpu:
            problems.append(f"GPU {key}: {gpu_pods[key]} pods > {replicas_per_gpu} replicas")
    for n, used in cpu.items():
        if used > int(nodes[n]["cpu_milli"]):
            problems.append(f"node {n}: cpu {used} > {nodes[n]['cpu_milli']}")
    for n, used in mem.items():
        if used > int(nodes[n]["memory_mib"]):
            problems.append(f"node {n}: memory {used} > {nodes[n]['memory_mib']}")
    return problems
