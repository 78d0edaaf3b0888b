"""A second pod watch beside kube-scheduler's, in JSON or protobuf: what one costs the API server.

Issue 55, item 1: whether gpufrac's pod watch should read JSON or, as kube-scheduler's
informer does, protobuf (it reads protobuf since decision record 0031). ``bench_scheduler``
runs this watcher beside the no-op extender ("no-op json watcher", "no-op protobuf
watcher"), and ``bench_watchers`` beside a protobuf one standing in for kube-scheduler's,
so that the API server's CPU, against the setup without it, is what a watcher costs it in
each encoding. The events are read and dropped (their decoding is the watcher's own CPU,
not measured here).

Run: ``python -m benchmarks pod-watcher KUBECONFIG --encoding json|protobuf`` (until killed,
or ``--max-requests`` watch requests have ended).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.controlplane import ControlPlane
from harness.processes import Proc, start
from podspec.kubeio import kube_api

ACCEPT = {"json": "application/json",
          "protobuf": "application/vnd.kubernetes.protobuf;stream=watch"}
"""The ``Accept`` header of each encoding (the API server's watch content types)."""

WATCH_S = 600
"""Each watch request's ``timeoutSeconds``; a new one follows."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks pod-watcher``."""
    p.add_argument("kubeconfig", type=Path)
    p.add_argument("--encoding", choices=sorted(ACCEPT), default="json")
    p.add_argument("--max-requests", type=int, default=1000, help="watch requests before it stops")


def run(args: argparse.Namespace) -> int:
    """Watch every pod of the cluster, dropping what arrives; 1 when no request was answered 200."""
    api = kube_api(args.kubeconfig)
    pool = api.api_client.rest_client.pool_manager
    url = (f"{api.api_client.configuration.host}/api/v1/pods?watch=true&allowWatchBookmarks=true"
           f"&timeoutSeconds={WATCH_S}")
    ok = 0
    for _ in range(args.max_requests):
        resp = pool.request("GET", url, headers={"Accept": ACCEPT[args.encoding]}, preload_content=False,
                            timeout=WATCH_S + 30)
        if resp.status == 200:
            ok += 1
            for _chunk in resp.stream(65536):
                pass
        resp.release_conn()
        if resp.status != 200:
            time.sleep(1)
    return 0 if ok else 1


def start_watcher(cp: ControlPlane, encoding: str, name: str = "pod-watcher") -> Proc:
    """This watcher on ``cp``'s API server as a process ``cp`` tracks (``name``: its log's), for
    the second-watch setups of ``bench scheduler`` and ``bench watchers``."""
    return cp.track(start(name, [sys.executable, "-m", "benchmarks", "pod-watcher", str(cp.admin_kubeconfig),
                                 "--encoding", encoding], cp.workdir))
