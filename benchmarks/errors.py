"""``UsageError``: a benchmark's arguments that do not go together (``python -m benchmarks``
prints it as argparse prints a usage error, exit status 2)."""


class UsageError(ValueError):
    """Arguments that parse but do not make a run; the message says which and why."""
