"""CPU time of a running process, for the benchmarks that compare gpufrac with the no-op extender."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (``/proc/<pid>/stat``, in clock
    ticks of ``SC_CLK_TCK``: 10 ms on Linux); 0 if the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
