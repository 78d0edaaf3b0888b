"""The soak benchmark's quick mode, as benchmarks/README shows it: the command runs, and its
checks hold on a small cluster (a fault of each kind, no over-commit, no leaked hold)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_soak_quick_mode_passes_its_own_checks(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "soak", "--pods", "200", "--minutes", "1.0", "--nodes", "8",
         "--fault-every-s", "9", "--lifetime-s", "10", "--drain-s", "30", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    summary = result["summary"]
    assert result["ok"] and summary["pods_created"] == 200
    assert {f["fault"] for f in result["faults"]} == {"apiserver", "gpufrac-kill", "node-readd", "inventory-invalid"}
    assert summary["invariant_violations_at_end"] == [] and summary["leaked_allocations"] == []
    assert summary["gpu_allocated_milli_after_delete"] == 0
    assert (out / "soak.png").stat().st_size > 10_000
