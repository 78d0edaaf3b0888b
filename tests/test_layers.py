"""Project-wide checks: import layering (import-linter contracts in pyproject.toml) and ruff."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} not installed (pip install -e '.[dev]')"
    return found


def test_import_contracts_kept() -> None:
    # scoring/ imports no HTTP, Kubernetes, pydantic or YAML; routes reach the core only
    # through extender.translate; layers run cli > app > routes > deps > cache > translate.
    r = subprocess.run([_tool("lint-imports")], cwd=REPO, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_ruff_clean() -> None:
    r = subprocess.run([_tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
