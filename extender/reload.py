"""Live reload of the admin config file (mounted from a ConfigMap) without a restart.

The file is polled: its bytes are hashed every ``poll_s`` seconds, which also sees the
symlink swap by which kubelet updates a mounted ConfigMap (an inotify watch on the file would
miss it). A changed file is validated in full (``extender.admin_config.parse_admin_config``)
before anything is applied; an invalid one is logged with its field paths and counted, and
the previous config stays in force.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from extender.admin_config import AdminConfig, ConfigError, parse_admin_config
from extender.metrics import Metrics

log = logging.getLogger(__name__)


class ConfigWatcher:
    """Poll one admin config file and apply each valid change.

    Parameters
    ----------
    path : Path
    apply : callable
        Called with the new ``AdminConfig`` (the cache swaps scorer and tenants atomically).
    metrics : Metrics
        ``gpufrac_config_reloads_total{result}`` and ``gpufrac_config_valid``.
    poll_s : float
        Seconds between two reads of the file.
    """

    def __init__(self, path: Path, apply: Callable[[AdminConfig], None], metrics: Metrics,
                 poll_s: float) -> None:
        self.path = path
        self._apply = apply
        self._metrics = metrics
        self._poll_s = poll_s
        self._digest = self._read_digest()[1]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read_digest(self) -> tuple[bytes | None, str | None]:
        try:
            data = self.path.read_bytes()
        except OSError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def check(self) -> bool | None:
        """Read the file once; apply it if it changed and is valid.

        Returns
        -------
        bool or None
            None: unchanged (or unreadable: a ConfigMap update in progress). True: applied.
            False: changed but invalid; the previous config stays.
        """
        data, digest = self._read_digest()
        if data is None or digest == self._digest:
            return None
        self._digest = digest
        try:
            policy = parse_admin_config(data.decode("utf-8", errors="replace"), str(self.path))
        except ConfigError as exc:
            self._metrics.config_reloads.labels("rejected").inc()
            self._metrics.config_valid.set(0)
            log.error("config reload rejected, the previous config stays in force: %s: %s",
                      self.path, str(exc).replace("\n", "; "))
            return False
        self._apply(policy)
        self._metrics.config_reloads.labels("applied").inc()
        self._metrics.config_valid.set(1)
        log.warning("config reloaded from %s (sha256 %s)", self.path, (digest or "")[:12])
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check()
            except Exception:  # never let the watcher die: the next poll tries again
                log.exception("config reload failed")

    def start(self) -> None:
        """Start polling in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="gpufrac-config", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
