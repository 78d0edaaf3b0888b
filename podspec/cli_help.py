"""One help style for gpufrac's command lines (``gpufrac``, ``python -m benchmarks``)."""

from __future__ import annotations

import argparse


def describe_subcommands(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand's own ``--help`` the one-line help its parent lists it with
    (argparse shows ``help=`` only in the parent's list), recursively."""
    for action in parser._actions:  # argparse has no public walk of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    sub.description = helps[name]
                describe_subcommands(sub)
