"""The churn replay's offered load: trace pods arriving as a Poisson stream, each for its own lifetime.

At the trace's own times the openb cluster is nearly idle: the default list keeps at most 66 of
its 6,212 GPUs busy (14 on average over its 149 days), and 86 pods that live longer than a day
hold 91 % of its GPU-time. Compressing its times cannot load the cluster either: the long pods
that carry the demand would outlive the compressed trace. So the replay keeps what the trace
says of each pod (its shape and its lifetime) and draws the arrivals:

- pods are drawn uniformly, with replacement, from the pod list (seeded);
- they arrive as a Poisson process of rate ``lambda``; each runs for its trace lifetime
  ``deletion_time - creation_time`` once placed, cut at ``C`` (``--lifetime-cap-hours``);
- ``lambda`` makes the offered GPU load ``load`` times the capacity (Little's law):
  ``lambda * E[gpu_request_milli * min(lifetime_s, C)] = load * capacity_milli``.

From ``t = C`` on the offered demand is stationary (every pod that arrived before ``t - C`` has
had its whole lifetime), so the replay measures after a warm-up of at least ``C``. The cap keeps
a run short: the trace's lifetimes reach 145 days.

A pod that waits still runs its whole lifetime after it starts: demand that waits is deferred,
not lost, as a platform team's jobs are.

Pod lists without times (the openb ``multigpu*`` variants list shapes only) borrow them
(``borrow_lifetimes``): each pod takes the lifetime of a pod of the default list of its class
(CPU-only, a share of one GPU, one whole GPU, ``k`` whole GPUs), chosen by a hash of its name,
so a variant's pod lives as the default list's pods of its shape live, and every seed sees
the same lifetimes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.trace import TracePod

ARRIVAL_BLOCK = 4096
"""Arrivals drawn per block (the draws do not depend on the run's length)."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One pod of the offered load.

    Attributes
    ----------
    t_s : float
        Arrival time, seconds from the start of the run.
    pod : TracePod
        The drawn trace pod, renamed ``<original>-a<i>`` (``i``: arrival number).
    lifetime_s : float
        How long it runs once placed, seconds (its trace lifetime, at most the cap ``C``).
    """

    t_s: float
    pod: TracePod
    lifetime_s: float


def arrival_rate_per_s(pods: list[TracePod], capacity_milli: int, load: float, cap_s: float) -> float:
    """``lambda`` of the module docstring, arrivals per second.

    Raises
    ------
    ValueError
        When no pod has both a GPU request and a lifetime (a pod list without times), or
        ``load`` or ``run_s`` is not positive.
    """
    if load <= 0 or cap_s <= 0:
        raise ValueError(f"load and lifetime cap must be positive (got {load}, {cap_s} s)")
    work = np.array([p.gpu_request_milli * min(p.lifetime_s, cap_s) for p in pods], dtype=np.float64)
    if not pods or not work.any():
        raise ValueError("no pod has a GPU request and a lifetime: the churn replay needs a pod list "
                         "with creation_time and deletion_time (openb default, cpu*, gpushare*)")
    return load * capacity_milli / float(work.mean())


def offered_arrivals(pods: list[TracePod], capacity_milli: int, load: float, run_s: float,
                     cap_s: float, seed: int) -> list[Arrival]:
    """The arrivals of one run, in time order (module docstring).

    Parameters
    ----------
    pods : list of TracePod
        A pod list with lifetimes (``trace.load_pods``).
    capacity_milli : int
        The cluster's GPU capacity, milli-GPU.
    load : float
        Offered GPU load as a fraction of capacity (1.0: demand equals capacity on average).
    run_s : float
        Length of the run, seconds.
    cap_s : float
        Longest lifetime, seconds (``C``).
    seed : int

    Returns
    -------
    list of Arrival

    Raises
    ------
    ValueError
        As ``arrival_rate_per_s``.
    """
    rate = arrival_rate_per_s(pods, capacity_milli, load, cap_s)
    rng = np.random.default_rng(seed)
    # Fixed blocks of (gap, pick) pairs: a shorter run's arrivals are a prefix of a longer one's.
    out: list[Arrival] = []
    t = 0.0
    while True:
        gaps = rng.exponential(1.0 / rate, size=ARRIVAL_BLOCK)
        picks = rng.integers(len(pods), size=ARRIVAL_BLOCK)
        times = t + np.cumsum(gaps)
        for t_s, k in zip(times.tolist(), picks.tolist(), strict=True):
            if t_s >= run_s:
                return out
            src = pods[k]
            out.append(Arrival(t_s, replace(src, name=f"{src.name}-a{len(out)}"),
                               float(min(src.lifetime_s, cap_s))))
        t = float(times[-1])


def lifetime_class(p: TracePod) -> tuple[int, bool]:
    """``(GPUs, whole)``: the class a pod borrows a lifetime within (``borrow_lifetimes``)."""
    return p.num_gpu, p.num_gpu > 0 and p.gpu_milli >= 1000


def borrow_lifetimes(pods: list[TracePod], donors: list[TracePod]) -> list[TracePod]:
    """``pods`` with a lifetime each, borrowed from ``donors`` of the same class (module notes).

    A pod that has a lifetime keeps it. A class without donors takes the donors with the most
    GPUs below it (an 8-GPU pod of a list whose donors have none takes those of 4 GPUs).

    Raises
    ------
    ValueError
        When no donor has a lifetime.
    """
    by_class: dict[tuple[int, bool], list[int]] = {}
    for d in donors:
        if d.lifetime_s > 0:
            by_class.setdefault(lifetime_class(d), []).append(d.lifetime_s)
    if not by_class:
        raise ValueError("no donor pod has a lifetime (creation_time and deletion_time)")
    for times in by_class.values():
        times.sort()
    out = []
    for p in pods:
        if p.lifetime_s > 0:
            out.append(p)
            continue
        cls = lifetime_class(p)
        if cls not in by_class:
            below = [c for c in by_class if c[1] == cls[1] and c[0] <= cls[0]] or list(by_class)
            cls = max(below)
        times = by_class[cls]
        out.append(replace(p, lifetime_s=times[zlib.crc32(p.name.encode()) % len(times)]))
    return out
