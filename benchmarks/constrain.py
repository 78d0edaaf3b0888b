"""Model-constrained openb pod lists: a seeded rule that gives a share of the GPU pods a ``gpu_spec``.

The public openb pod lists carry no ``gpu_spec`` (every pod accepts every model), but real
clusters mix GPU models and many pods accept only some (``gpufrac.io/gpu-model``). This
module turns any openb pod list into a model-constrained one, so that placement can be
measured where models matter. The rule, for a list with ``n`` GPU pods and a share ``q``:

1. ``round(q * n)`` GPU pods are chosen uniformly at random without replacement (CPU-only
   pods stay as they are; they have no GPU to choose).
2. For each chosen pod, the candidate models are those with at least one node that could
   hold the pod alone (enough GPUs of the model on one node for its ``num_gpu``, and the
   node's CPU and memory): a restriction never makes a pod impossible.
3. The pod accepts 1, 2 or 3 of them (probabilities ``MODELS_PER_POD``: 0.6, 0.3, 0.1; fewer
   if fewer are candidates), drawn without replacement with probability proportional to
   each model's GPU count in the cluster. Demand restricted to a model then grows with the
   model's capacity, as when teams ask for the models a cluster mostly has, and a model
   with a handful of GPUs (openb's 2 A10s) is rarely asked for alone.

Clones appended by ``trace.arrival_sequence`` copy their original's ``gpu_spec``, so the
restricted share holds for the whole arrival sequence, in expectation. The rule reads only
the pod list, the node list and its own seed (``--constrain-seed``, 0 unless told), never
the arrival seed: one variant is one pod list, replayed under every arrival seed.

A variant is named ``<openb variant>-m<percent>`` (``default-m20``: ``openb_pod_list_default.csv``
with 20 % of its GPU pods restricted).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from benchmarks.trace import TracePod
from scoring.specs import NodeSpec

MODELS_PER_POD = (0.6, 0.3, 0.1)
"""Probability that a restricted pod accepts 1, 2 or 3 models."""

def parse_suffix(name: str, letter: str) -> tuple[str, float]:
    """``<base>-<letter><PCT>`` -> ``(base, PCT)``; a name without the suffix -> ``(name, 0.0)``.

    Raises
    ------
    ValueError
        For a percentage above 100.
    """
    m = re.match(rf"^(?P<base>.+)-{letter}(?P<pct>\d{{1,3}})$", name)
    if m is None:
        return name, 0.0
    pct = float(m["pct"])
    if pct > 100:
        raise ValueError(f"{name}: at most 100 % of the pods")
    return m["base"], pct


def parse_variant(name: str) -> tuple[str, float]:
    """``default-m20`` -> ``("default", 20.0)``; a plain openb variant -> ``(name, 0.0)``.

    Raises
    ------
    ValueError
        For a percentage above 100.
    """
    return parse_suffix(name, "m")


def pick_pods(pods: Sequence[TracePod], pct: float, seed: int,
              eligible: Callable[[TracePod], bool]) -> tuple[np.random.Generator, list[int]]:
    """``round(pct % of the eligible pods)`` drawn uniformly without replacement: the seeded
    generator (for the rule's later draws) and the chosen positions, ascending.

    Raises
    ------
    ValueError
        If ``pct`` is outside [0, 100].
    """
    if not 0.0 <= pct <= 100.0:
        raise ValueError(f"pct must be in [0, 100], got {pct}")
    rng = np.random.default_rng(seed)
    idx = [i for i, p in enumerate(pods) if eligible(p)]
    chosen = rng.choice(len(idx), size=round(pct / 100.0 * len(idx)), replace=False)
    return rng, sorted(int(idx[c]) for c in chosen)


def restrict_models(pods: Sequence[TracePod], pct: float, nodes: Sequence[NodeSpec],
                    seed: int = 0) -> list[TracePod]:
    """Give ``pct`` % of the GPU pods a ``gpu_spec`` by the rule in the module notes.

    Parameters
    ----------
    pods : sequence of TracePod
        An openb pod list (``trace.load_pods``), in its order (sorted by name).
    pct : float
        Share of the GPU pods to restrict, percent in [0, 100].
    nodes : sequence of NodeSpec
        The cluster (``load_cluster_file``); models and their GPU counts come from it.
    seed : int
        The rule's own seed.

    Returns
    -------
    list of TracePod
        The same pods in the same order; chosen ones have ``gpu_spec`` set to 1-3 models
        joined by ``|``. Pods that already had a ``gpu_spec`` keep it and are not chosen.

    Raises
    ------
    ValueError
        If ``pct`` is outside [0, 100].
    """
    rng, chosen = pick_pods(pods, pct, seed, lambda p: bool(p.num_gpu and not p.gpu_spec))
    models = sorted({g.model for n in nodes for g in n.gpus})
    gpus = np.array([sum(1 for n in nodes for g in n.gpus if g.model == m) for m in models], dtype=np.float64)
    # Per model: the most GPUs of it on one node, and the largest CPU and memory a node of it
    # with at least k GPUs offers, for k = 1..8 (a pod needs all three on one node).
    hosts: list[list[tuple[int, int, int]]] = [
        [(sum(1 for g in n.gpus if g.model == m), n.cpu_milli, n.memory_mib) for n in nodes
         if any(g.model == m for g in n.gpus)] for m in models]
    out = list(pods)
    for i in chosen:
        p = out[i]
        ok = np.array([any(k >= p.num_gpu and c >= p.cpu_milli and q >= p.memory_mib for k, c, q in h)
                       for h in hosts])
        if not ok.any():
            continue
        want = min(int(rng.choice(len(MODELS_PER_POD), p=MODELS_PER_POD)) + 1, int(ok.sum()))
        w = np.where(ok, gpus, 0.0)
        pick = rng.choice(len(models), size=want, replace=False, p=w / w.sum())
        out[i] = replace(p, gpu_spec="|".join(sorted(models[j] for j in pick)))
    return out
