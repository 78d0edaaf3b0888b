"""harness/builds.py without a network: what ensure_etcd does on a machine without systemd."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness import builds


def test_etcd_installed_where_no_systemd_runs_is_returned_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh root without an init system (the clean-root run of .ci/clean-root, a container):
    # apt-get installs etcd-server, and there is no systemctl to stop Debian's service with.
    # ensure_etcd called systemctl anyway and raised FileNotFoundError, so the e2e suite's
    # session control plane never came up on such a machine.
    etcd = Path("/usr/bin/etcd")
    monkeypatch.setattr(builds, "installed", lambda command: None)
    monkeypatch.setattr(builds, "ensure_debian", lambda command, package: etcd)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "systemctl" else real_which(name))
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    assert builds.ensure_etcd() == etcd
    assert ran == []
    # Where systemd runs, Debian's own etcd service is stopped (ours uses other ports).
    monkeypatch.setattr(shutil, "which", lambda name: "/bin/systemctl" if name == "systemctl" else None)
    assert builds.ensure_etcd() == etcd
    assert ran and ran[-1][-3:] == ["/bin/systemctl", "stop", "etcd"]
