"""``gpufrac ... | head``: a reader that stops early ends the command quietly, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.processes import ROOT


def test_a_closed_pipe_on_stdout_is_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write is EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "extender", "inventory-schema"], cwd=ROOT,
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert done.returncode == 1, done.stderr.decode()
    assert b"Traceback" not in done.stderr and b"BrokenPipeError" not in done.stderr, done.stderr.decode()
