"""One help style: every subcommand's own --help says what it does, every choice is listed."""

from __future__ import annotations

import argparse

import pytest

from extender.cli import build_parser
from podspec.cli_help import describe_subcommands


def subcommands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(f"{path} {name}".strip(), sub), *subcommands(sub, f"{path} {name}")]
    return out


def test_every_gpufrac_subcommand_describes_itself() -> None:
    found = subcommands(build_parser())
    assert {name for name, _ in found} >= {"serve", "inspect", "config", "config validate", "config schema", "demo"}
    assert [name for name, sub in found if not sub.description] == []


def test_every_benchmarks_subcommand_describes_itself() -> None:
    pytest.importorskip("matplotlib")  # the bench extra; `python -m benchmarks` says so without it
    from benchmarks.cli import build_parser as bench_parser

    found = subcommands(bench_parser())
    assert {"replay", "soak"} <= {name for name, _ in found}
    assert [name for name, sub in found if not sub.description] == []


def test_an_explicit_description_is_kept() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sub.add_parser("a", help="short", description="the long story")
    sub.add_parser("b", help="only help")
    describe_subcommands(parser)
    assert [(n, s.description) for n, s in subcommands(parser)] == [("a", "the long story"), ("b", "only help")]
