"""``python -m benchmarks bench watchers`` runs as documented, on its own control plane (a
small size: the numbers are the benchmark's business, their shape is checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_watchers import SETUPS

ROOT = Path(__file__).resolve().parents[2]


def test_bench_watchers_measures_every_setup_in_every_round(tmp_path: Path) -> None:
    out = tmp_path / "watch-encoding.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "bench", "watchers", "--pods", "5", "--updates", "40",
                           "--rounds", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["round"], r["setup"]) for r in rows] == [(i, s) for i in range(2) for s in SETUPS]
    assert all(r["apiserver_ms_per_update"] > 0 for r in rows)  # every update cost the API server something
    assert "| + protobuf watch |" in proc.stdout
