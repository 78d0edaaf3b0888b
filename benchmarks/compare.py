"""``python -m benchmarks replay --compare``: several policies over seeds and openb variants, side by side.

Every (variant, policy) cell is an ordinary replay (``benchmarks.replay.replay_seeds``) with
its own extender, run one after the other in one process, so their timings are comparable.
Writes to ``--out``:

- ``compare.json``: every cell's ``result.json`` record (rewritten after each cell, so a long
  run that is stopped keeps what it finished);
- ``compare.md``: median unallocated GPU % at 100 % arrived per variant and policy, the
  published FGD value beside it, and replay time per policy;
- ``compare-allocation.png``: GPU allocation ratio vs arrived workload, one line per policy
  (median over seeds), on the first variant (Weng et al., USENIX ATC '23, Fig. 9a);
- ``compare-variants.png``: unallocated % per variant and policy, with the published FGD
  value marked (the paper's per-variant bar charts).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import constrain, memory, replay, trace
from benchmarks.scheduler_emulation import Profile

PAPER_VARIANTS = ("cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60", "gpushare80",
                  "gpushare100", "multigpu20", "multigpu30", "multigpu40", "multigpu50")
"""The variants whose FGD results the paper reports (``../shared/traces/openb/README.md``)."""

PUBLISHED_FGD_UNALLOCATED_PCT = {
    "default": 4.77, "cpu050": 5.00, "cpu100": 4.79, "cpu200": 5.18, "cpu250": 6.80,
    "gpushare40": 6.04, "gpushare60": 8.75, "gpushare80": 10.92, "gpushare100": 13.36,
    "multigpu20": 4.47, "multigpu30": 3.64, "multigpu40": 3.09, "multigpu50": 2.91,
}
"""FGD's unallocated GPU % at 100 % arrived (Weng et al., ATC '23; default: median of 10 seeds,
variants: mean of 10 seeds), as listed in the trace's README."""

def variant_names(requested: list[str]) -> list[str]:
    """Expand ``all``; check that every variant's pod list exists.

    Raises
    ------
    ValueError
        For a variant without ``openb_pod_list_<variant>.csv`` in the bundled trace.
    """
    names = ["default", *PAPER_VARIANTS] if requested == ["all"] else requested
    for v in names:
        if not pods_path(v).is_file():
            raise ValueError(f"--variants: no pod list {pods_path(v)}")
    return names


def pods_path(variant: str) -> Path:
    """The bundled pod list of an openb variant (of its base for ``<variant>-m<PCT>``).

    Raises
    ------
    ValueError
        For a model-constrained share above 100 %.
    """
    return trace.TRACE_DIR / f"openb_pod_list_{parse_variant(variant)[0]}.csv"


def parse_variant(variant: str) -> tuple[str, float, float]:
    """``default-m20-g30`` -> (openb variant, % of GPU pods model-restricted, % asking for GPU
    memory on the mixed-memory cluster); see ``benchmarks.constrain`` and ``benchmarks.memory``.

    Raises
    ------
    ValueError
        For a percentage above 100.
    """
    rest, memory_pct = memory.parse_variant(variant)
    base, model_pct = constrain.parse_variant(rest)
    return base, model_pct, memory_pct


def _is_config_file(policy: str) -> bool:
    return policy.endswith((".yaml", ".yml"))


def split_policy(entry: str) -> tuple[str, Path | None]:
    """``POLICY[@SCHEDULER_CONFIG]`` -> (policy, scheduler config or None for ``--scheduler-config``)."""
    policy, _, sched = entry.partition("@")
    return policy, Path(sched) if sched else None


def policy_label(entry: str) -> str:
    """A preset's name or an admin config file's stem, ``@`` the scheduler config's stem if given."""
    policy, sched = split_policy(entry)
    label = Path(policy).stem if _is_config_file(policy) else policy
    return f"{label}@{sched.stem.removeprefix('scheduler-config-')}" if sched else label


def _cell_args(args: argparse.Namespace, variant: str, entry: str) -> argparse.Namespace:
    policy, sched = split_policy(entry)
    is_file = _is_config_file(policy)
    return argparse.Namespace(**{
        **vars(args), "pods": pods_path(variant), "compare": None,
        "model_constrained": parse_variant(variant)[1] or args.model_constrained,
        "memory_requests": parse_variant(variant)[2] or args.memory_requests,
        "gpu_memory": "mixed" if parse_variant(variant)[2] else args.gpu_memory,
        "preset": "default" if is_file else policy, "config": Path(policy) if is_file else None,
        "scheduler_config": sched or args.scheduler_config,
        "out": args.out / variant / policy_label(entry),
    })


def run(args: argparse.Namespace, profile: Profile) -> int:
    """Replay every policy on every variant; write the table, JSON and plots; print the table.

    A policy written ``POLICY@FILE`` is replayed under the kube-scheduler profile in ``FILE``
    (e.g. ``bestfit@benchmarks/scheduler-config-simulator.yaml``), the others under ``profile``.
    """
    variants = variant_names(args.variants)
    cells: dict[str, dict[str, Any]] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        for policy in args.compare:
            cell = _cell_args(args, variant, policy)
            cell_profile = replay.profile_from_args(cell) if split_policy(policy)[1] else profile
            started = time.perf_counter()
            results = replay.replay_seeds(cell, cell_profile)
            record = replay.result_record(cell, cell_profile, results, time.perf_counter() - started)
            cells.setdefault(variant, {})[policy_label(policy)] = record
            replay.write_json(args.out / "compare.json", cells)
            print(f"{variant} / {policy_label(policy)}: median unallocated @100% "
                  f"{record['median']['unallocated_pct_100']:.2f}%", flush=True)
    table = markdown_table(cells, args.seeds, in_process=bool(args.in_process))
    (args.out / "compare.md").write_text(table)
    plot_allocation(args.out / "compare-allocation.png", cells[variants[0]], variants[0], args.seeds)
    plot_variants(args.out / "compare-variants.png", cells)
    print(table)
    return 0


def markdown_table(cells: dict[str, dict[str, Any]], seeds: list[int], in_process: bool) -> str:
    """Median unallocated % (min-max over seeds) per variant and policy, and replay time.

    Parameters
    ----------
    cells : dict
        variant -> policy label -> ``result.json`` record.
    seeds : list of int
    in_process : bool
        Whether the decisions were made in process (pure core) or through HTTP.
    """
    policies = list(next(iter(cells.values())))
    how = "in process (pure core, no HTTP)" if in_process else "through HTTP"
    lines = [
        f"Unallocated GPU % of capacity at 100 % arrived workload, median over seeds "
        f"{seeds[0]}..{seeds[-1]} (min-max), {how}; lower is better.",
        "",
        "| variant | " + " | ".join(policies) + " | published FGD |",
        "|---|" + "---|" * (len(policies) + 1),
    ]
    for variant, row in cells.items():
        vals = []
        for p in policies:
            per_seed = [s["unallocated_pct_100"] for s in row[p]["seeds"].values()]
            vals.append(f"{row[p]['median']['unallocated_pct_100']:.2f} "
                        f"({min(per_seed):.2f}-{max(per_seed):.2f})")
        published = PUBLISHED_FGD_UNALLOCATED_PCT.get(variant)
        lines.append(f"| {variant} | " + " | ".join(vals)
                     + f" | {published if published is not None else '-'} |")
    secs = {p: sum(row[p]["median"]["seconds"] for row in cells.values()) for p in policies}
    lines += ["", "| policy | replay seconds (all variants, all seeds) | pods/s (median) |",
              "|---|---|---|"]
    for p in policies:
        rate = float(np.median([row[p]["median"]["pods_per_s"] for row in cells.values()]))
        lines.append(f"| {p} | {secs[p]:.0f} | {rate:.0f} |")
    return "\n".join(lines) + "\n"


def plot_allocation(out: Path, row: dict[str, Any], variant: str, seeds: list[int]) -> None:
    """Allocation ratio vs arrived workload, one line per policy (Fig. 9a of the paper)."""
    curves = {p: list(rec["curves"].values()) for p, rec in row.items()}
    replay.plot(out, curves, f"openb {variant}, seeds {seeds[0]}..{seeds[-1]}")


def plot_variants(out: Path, cells: dict[str, dict[str, Any]]) -> None:
    """Grouped bars: unallocated % at 100 % arrived per variant and policy; FGD as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(cells)
    policies = list(next(iter(cells.values())))
    x = np.arange(len(variants))
    width = 0.8 / len(policies)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(variants)), 4.5), dpi=120)
    for i, p in enumerate(policies):
        ax.bar(x + (i - (len(policies) - 1) / 2) * width,
               [cells[v][p]["median"]["unallocated_pct_100"] for v in variants], width, label=p)
    pub = [PUBLISHED_FGD_UNALLOCATED_PCT.get(v, np.nan) for v in variants]
    ax.scatter(x, pub, marker="_", s=900, color="black", zorder=3, label="published FGD")
    ax.set_xticks(x, variants, rotation=30, ha="right")
    ax.set_ylabel("unallocated GPU % at 100% arrived")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
