"""The start-up benchmark runs end to end and accounts every record it wrote as trusted."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import cli


def test_bench_startup_times_every_step(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    assert cli.main(["bench", "startup", "--nodes", "12", "--pods", "300", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["steps"]) == 6 and all(s["seconds"] >= 0 for s in doc["steps"])
    # the kernels compiled cold, in a child process (the dev install has numba), and took time
    assert doc["steps"][0]["step"].startswith("scoring kernels (numba ") and doc["steps"][0]["seconds"] > 0
    # 12 nodes x 8 GPUs fill before 300 pods: some bound, the rest pending, and every record
    # first-fit wrote is one gpufrac could have made (none counted as an over-commit).
    assert 0 < doc["meta"]["pods_bound"] < 300 and doc["meta"]["overcommitted"] == 0
