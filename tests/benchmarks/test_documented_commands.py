"""Every benchmark command the docs give parses as written.

The commands in ``sh`` blocks of the docs (README, docs/, benchmarks/README) and the
command column of ``benchmarks/results/MANIFEST.md`` ("the command as it is spelled today")
are parsed by ``python -m benchmarks``' own parser: a renamed verb or flag fails here, not in
a reader's shell. (Running them is the benchmarks' own business: most take minutes to hours;
``tests/benchmarks/test_replay.py`` runs the replay's smoke forms.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from benchmarks.cli import build_parser
from harness import docs

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["README.md", "benchmarks/README.md",
           *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")
                   if p.name != "benchmark-log.md")]  # the log keeps the spelling of its day


def sh_commands(doc: str) -> list[str]:
    """``python -m benchmarks`` commands of ``doc``'s shell blocks (continuations joined)."""
    text = (REPO / doc).read_text()
    out = []
    for block in docs.BLOCK.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        out += [docs.COMMENT.sub("", line).strip() for line in joined.splitlines()
                if line.strip().startswith(("python -m benchmarks", ".venv/bin/python -m benchmarks"))]
    return out


def manifest_commands() -> list[str]:
    """The command column of results/MANIFEST.md (one backticked command per row)."""
    rows = [line.split("|") for line in (REPO / "benchmarks/results/MANIFEST.md").read_text().splitlines()
            if line.startswith("| `")]
    return [m for row in rows if len(row) > 2 for m in re.findall(r"`(python -m benchmarks [^`]*)`", row[2])]


COMMANDS = sorted({*(c for doc in SOURCES for c in sh_commands(doc)), *manifest_commands()})


def test_the_docs_give_commands_to_check() -> None:
    assert len(manifest_commands()) >= 20 and any("replay" in c for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_documented_command_parses(command: str) -> None:
    argv = shlex.split(command)
    start = argv.index("benchmarks") + 1
    try:
        build_parser().parse_args(argv[start:])
    except SystemExit as exc:
        pytest.fail(f"`{command}` does not parse (exit {exc.code})")
