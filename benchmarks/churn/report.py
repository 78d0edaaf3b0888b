"""The churn replay's report: one table per load (medians over seeds) and one picture."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.churn.measures import RunResult

GPU_CLASSES = ("fractional", "whole-1", "multi-gpu")


def duration(seconds: float) -> str:
    """``95`` -> ``1.6 min``; seconds below a minute, minutes below two hours, else hours."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def medians(runs: list[RunResult]) -> dict[str, Any]:
    """Medians over seeds of one (preset, load)'s runs."""
    out: dict[str, Any] = {
        "allocation_pct": _median([r.allocation_pct for r in runs]),
        "fragmentation_delay_pct": _median([r.fragmentation_delay_pct for r in runs]),
        "waiting_pct": _median([r.waiting_pct for r in runs]),
        "fragmentation_waiting_pods": _median([r.fragmentation_waiting_pods for r in runs]),
        "waiting_gpu_pods": _median([r.waiting_gpu_pods for r in runs]),
        "never_ran": _median([float(sum(r.pending[c]["never_ran"] for c in GPU_CLASSES)) for r in runs]),
        "seconds": sum(r.seconds for r in runs),
        "evictions_per_hour": _median([r.evictions_per_hour for r in runs]),
        "moved.p50_s": _median([r.moved_pending.get("p50_s", 0.0) for r in runs]),
        "moved.max_s": _median([r.moved_pending.get("max_s", 0.0) for r in runs]),
    }
    for c in GPU_CLASSES:
        for k in ("p50_s", "p99_s", "max_s"):
            out[f"{c}.{k}"] = _median([r.pending[c][k] for r in runs])
        out[f"{c}.n"] = _median([float(r.pending[c]["n"]) for r in runs])
        out[f"{c}.censored"] = _median([float(r.pending[c]["never_ran"] > 0.01 * r.pending[c]["n"]) for r in runs]) > 0
    return out


def _p99(m: dict[str, Any], c: str) -> str:
    """The p99 cell: ``>= x`` where more than 1 % of the class was still waiting at the end
    in the median run (the percentile then reads a censored wait: a lower bound, the window)."""
    return (">= " if m[f"{c}.censored"] else "") + duration(m[f"{c}.p99_s"])


def paired(results: list[RunResult], reference: str, other: str, load: float) -> dict[str, Any] | None:
    """``reference`` minus ``other`` per seed at ``load`` (the same arrivals): allocation points,
    GPU pods never run, multi-GPU p99 pending seconds; for each the mean, the 95 % t interval
    of the mean (None under two seeds) and the seeds where the reference is better / tied / worse.

    Returns None when the two share no seed.
    """
    by = {(r.preset, r.seed): r for r in results if r.load == load}
    seeds = sorted(s for p, s in by if p == reference and (other, s) in by)
    if not seeds:
        return None
    def never_ran(r: RunResult) -> float:
        return float(sum(r.pending[c]["never_ran"] for c in GPU_CLASSES))

    def multi_p99(r: RunResult) -> float:
        return r.pending["multi-gpu"]["p99_s"]

    def allocation(r: RunResult) -> float:
        return r.allocation_pct

    metrics: dict[str, tuple[Callable[[RunResult], float], float]] = {
        "allocation_pct": (allocation, 1.0),  # higher is better
        "never_ran": (never_ran, -1.0),
        "multi_p99_s": (multi_p99, -1.0),
    }
    out: dict[str, Any] = {"seeds": seeds}
    for name, (get, better) in metrics.items():
        d = [get(by[(reference, s)]) - get(by[(other, s)]) for s in seeds]
        mean = statistics.fmean(d)
        half = None
        if len(d) >= 2:
            from scipy import stats

            half = float(stats.t.ppf(0.975, len(d) - 1)) * statistics.stdev(d) / len(d) ** 0.5
        signs = [better * x for x in d]
        out[name] = {"diffs": d, "mean": mean, "ci95": None if half is None else (mean - half, mean + half),
                     "wins": sum(x > 0 for x in signs), "ties": sum(x == 0 for x in signs),
                     "losses": sum(x < 0 for x in signs)}
    return out


def _paired_cell(p: dict[str, Any], name: str, fmt: Any) -> str:
    x = p[name]
    ci = "" if x["ci95"] is None else f" [{fmt(x['ci95'][0])}, {fmt(x['ci95'][1])}]"
    return f"{fmt(x['mean'])}{ci} ({x['wins']}/{x['ties']}/{x['losses']})"


def comparison(results: list[RunResult], loads: list[float]) -> list[str]:
    """Markdown: the first preset against each other one, per load (``paired``)."""
    presets = list(dict.fromkeys(r.preset for r in results))
    if len(presets) < 2:
        return []
    ref = presets[0]
    lines = ["", f"### {ref} against each policy, per seed (same arrivals)", "",
             f"Mean of {ref} minus the policy over the seeds, its 95 % t interval in brackets, and in "
             f"parentheses the seeds where {ref} is better / tied / worse. An interval that holds 0 is a "
             "tie within the seeds' spread.", "",
             "| load | policy | GPU allocation, points | GPU pods never ran | multi-GPU p99 pending |",
             "|---|---|---|---|---|"]
    for load in loads:
        for other in presets[1:]:
            p = paired(results, ref, other, load)
            if p is None:
                continue
            lines.append(f"| {load:g} | {other} | {_paired_cell(p, 'allocation_pct', lambda v: f'{v:+.2f}')} | "
                         f"{_paired_cell(p, 'never_ran', lambda v: f'{v:+.1f}')} | "
                         f"{_paired_cell(p, 'multi_p99_s', lambda v: ('-' if v < 0 else '+') + duration(abs(v)))} |")
    return lines


def term_table(results: list[RunResult]) -> list[str]:
    """Markdown: what each strategy reads from the running and the arrival mix (``--terms``),
    medians over seeds of the window averages, per load."""
    with_terms = [r for r in results if r.terms]
    if not with_terms:
        return []
    from benchmarks.churn.terms import READINGS

    label = {"fgd": "fgd: whole-node types' popularity", "adaptive_balance": "adaptive_balance: multi-GPU share s",
             "gap_price": "gap_price: U(1000), milli", "priced_stranding": "priced_stranding: rho_cpu",
             "spare_nodes": "spare_nodes: P_k, largest k"}
    lines = ["", f"### What each term reads: the running mix against the arrival mix ({with_terms[0].preset})", "",
             "Time-average over the measured window, median over seeds.", "",
             "| load | term | running mix | arrival mix |", "|---|---|---|---|"]
    for load in sorted({r.load for r in with_terms}):
        runs = [r for r in with_terms if r.load == load]
        for name in READINGS:
            vals = [_median([r.terms[m][name] for r in runs if m in r.terms]) for m in ("running", "arrivals")]
            lines.append(f"| {load:g} | {label[name]} | {vals[0]:.4g} | {vals[1]:.4g} |")
    return lines


def markdown(results: list[RunResult], record: dict[str, Any], title: str = "") -> str:
    """Per load: a row per preset, medians over seeds; then the first preset against the others."""
    cmd = record["command"]
    seeds = sorted({r.seed for r in results})
    offset = cmd.get("node_offset", 0)
    lines = [(f"## {title}\n\n" if title else "")
             + f"Churn replay: {record['nodes']} nodes, {record['gpus']} GPUs (every {cmd['node_stride']}th node"
             f"{f' from the {offset}th' if offset else ''} of "
             f"{Path(cmd['nodes']).name}), pods of {Path(cmd['pods']).name} (lifetimes cut at {cmd['lifetime_cap_hours']:g} h), "
             f"{cmd['hours']:g} h per run measured after {cmd['warmup_hours']:g} h, seeds {', '.join(map(str, seeds))}; medians over seeds."
             + (" A quick run (--quick): a smoke test, not a result." if record["quick"] else "")]
    for load in sorted({r.load for r in results}):
        lines += ["", f"### offered load {load:g} x capacity", "",
                  "| policy | GPU allocation % | fragmentation delay % (pods) | GPU pods waiting % (pods) | "
                  "pending p50 / p99 / max: fractional | whole 1-GPU | multi-GPU | GPU pods never ran | "
                  "evictions / h (moved pods pending p50 / max) | run s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for preset in dict.fromkeys(r.preset for r in results):
            runs = [r for r in results if r.preset == preset and r.load == load]
            if not runs:
                continue
            m = medians(runs)
            cells = [f"{duration(m[f'{c}.p50_s'])} / {_p99(m, c)} / {duration(m[f'{c}.max_s'])}" for c in GPU_CLASSES]
            moved = (f"{m['evictions_per_hour']:.1f} ({duration(m['moved.p50_s'])} / {duration(m['moved.max_s'])})"
                     if m["evictions_per_hour"] else "-")
            lines.append(f"| {preset} | {m['allocation_pct']:.2f} | {m['fragmentation_delay_pct']:.1f} "
                         f"({m['fragmentation_waiting_pods']:.1f}) | {m['waiting_pct']:.1f} ({m['waiting_gpu_pods']:.1f}) | "
                         f"{' | '.join(cells)} | {m['never_ran']:.0f} | {moved} | {m['seconds']:.0f} |")
    lines += comparison(results, sorted({r.load for r in results}))
    lines += term_table(results)
    lines += ["", "GPU allocation: time-weighted share of GPU capacity allocated. Fragmentation delay: % of the time "
              "in which some GPU pod waited while the free GPU share summed over the cluster was at least its "
              "request; in brackets the time-average number of such pods. GPU pods waiting: % of the time any "
              "waited, and their time-average number. Pending time counts a pod still waiting at the end as "
              "waiting until then; a p99 marked >= had more than 1 % of its class still waiting at the end (in "
              "the median run): it reads a censored wait, a lower bound set by the window. Evictions: made acting "
              "on the defragmentation plan (+defrag), per hour "
              "of the measured window; the evicted pods' replacements' pending time apart (not in the classes)."]
    return "\n".join(lines) + "\n"


def plot(out: Path, record: dict[str, Any]) -> None:
    """Allocation and pending GPU pods over time, one line per preset, a row per load (first seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list[float]]] = record["series"]
    loads = sorted({float(k.rsplit("@", 1)[1]) for k in series})
    fig, axes = plt.subplots(len(loads), 2, figsize=(11, 3.4 * len(loads)), dpi=80, squeeze=False)
    warm = record["command"]["warmup_hours"]
    for row, load in enumerate(loads):
        for key, s in series.items():
            preset, at = key.rsplit("@", 1)
            if float(at) != load:
                continue
            axes[row][0].plot(s["t_h"][:len(s["allocation_pct"])], s["allocation_pct"], label=preset, lw=1)
            axes[row][1].plot(s["t_h"][:len(s["pending_gpu_pods"])], s["pending_gpu_pods"], label=preset, lw=1)
        axes[row][0].set_ylabel(f"load {load:g}: GPU allocation %")
        axes[row][1].set_ylabel("GPU pods pending")
        for ax in axes[row]:
            ax.axvline(warm, color="0.6", ls=":", lw=1)
            ax.grid(alpha=0.3)
        axes[row][0].legend(loc="lower right", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("simulated hours (dotted: end of warm-up)")
    title = "churn replay" + (" (quick: smoke run)" if record["quick"] else "")
    fig.suptitle(f"{title}: {record['gpus']} GPUs, seed {record['command']['seeds'][0]}")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
