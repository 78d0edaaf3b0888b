"""Every link and every repository path the docs name resolves.

The user-facing docs (README.md, CONTRIBUTING.md, docs/, docs/decisions/, deploy/README.md,
benchmarks/README.md) point at each other with Markdown links and at the code with
backticked paths (``scoring/strategies/fgd.py``); a moved file must not leave either behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted({REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "deploy/README.md",
               REPO / "benchmarks/README.md", *(REPO / "docs").rglob("*.md")})
LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTPUTS = {"dist", "build", "out", "replay-out"}
"""Top-level folders commands write (git-ignored): a doc naming what lands there names an output."""
TOP = sorted(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in OUTPUTS)
PATH = re.compile(r"`((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./-]*)`")
HISTORY = {"docs/decisions/benchmark-log.md"}
"""The log of past runs names the paths of their day."""


def targets(doc: Path) -> list[str]:
    return [t for t in LINK.findall(doc.read_text()) if not t.startswith(("http://", "https://", "mailto:", "#"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_resolves(doc: Path) -> None:
    broken = [t for t in targets(doc) if not (doc.parent / t.split("#")[0]).exists()]
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


@pytest.mark.parametrize("doc", [d for d in DOCS if d.relative_to(REPO).as_posix() not in HISTORY],
                         ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_repository_path_named_exists(doc: Path) -> None:
    text = re.sub(r"`[^`]*` \(pruned in [0-9a-f]{7}; in git history\)", "", doc.read_text())
    named = {m.rstrip(".") for m in PATH.findall(text) if not re.search(r"[<*{]", m)}
    # Outputs a command writes (replay-out/, a results directory a run creates) are named
    # relative to where the command runs; they are not in the repository until run.
    missing = sorted(p for p in named if not (REPO / p).exists() and not (doc.parent / p).exists())
    assert not missing, f"{doc.relative_to(REPO)}: {missing}"


def test_the_checks_see_links_and_paths() -> None:
    # The patterns find what the docs hold (a check that reads nothing cannot fail).
    assert "docs/install.md" in targets(REPO / "README.md")
    assert "scoring/strategies/__init__.py" in PATH.findall((REPO / "CONTRIBUTING.md").read_text())


def test_the_readme_stays_short() -> None:
    # Issue 53: what it is, why it wins, how to try it; contributor material in CONTRIBUTING.md.
    assert (REPO / "README.md").stat().st_size <= 12 * 1024


def test_results_stay_small() -> None:
    # Issue 40: benchmarks/results/ keeps summaries and per-seed numbers, at most 1 MB; what
    # a command regenerates (plots, curves) is not kept (results/MANIFEST.md).
    # The one picture kept is the churn replay's (issue 41 asks for it with the results):
    # a run of it takes half an hour, and its series are what the picture draws.
    # Counted as `du --apparent-size` counts (issue 56): every file and folder.
    entries = [REPO / "benchmarks/results", *(REPO / "benchmarks/results").rglob("*")]
    files = [p for p in entries if p.is_file()]
    assert files and sum(p.stat().st_size for p in entries) <= 1_000_000
    assert not [p for p in files if p.suffix == ".png" and p.name != "churn.png"]
    assert all(p.stat().st_size <= 250_000 for p in files if p.suffix == ".png")
