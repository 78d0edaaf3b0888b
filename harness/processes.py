"""Processes of the test harness: start one in its own process group with its log, wait for
it, stop it by PID; the loopback address and a free port; the harness's error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"


class ControlPlaneError(RuntimeError):
    """A control-plane binary could not be built or a process did not come up."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A started process, its log file, and how to stop it."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; by PID (the process group)."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout_s)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL now (crash simulation)."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def tail(self, n: int = 4000) -> str:
        """The end of the process's log."""
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def start(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Proc:
    """Start ``cmd`` in its own process group with stdout+stderr to ``workdir/name.log``."""
    log = workdir / f"{name}.log"
    fh = log.open("ab")
    popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, **(env or {})})
    fh.close()
    return Proc(name, popen, log, list(cmd), env)


def wait_until(check: Any, timeout_s: float, what: str, proc: Proc | None = None,
               interval_s: float = 0.2) -> Any:
    """Poll ``check()`` until it returns a truthy value; raise with the process log if not."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise ControlPlaneError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - polling: keep the last error for the message
            last = exc
        time.sleep(interval_s)
    tail = proc.tail() if proc else ""
    raise ControlPlaneError(f"timed out after {timeout_s}s waiting for {what} (last error: {last})\n{tail}")


