"""What one more pod watch costs the API server, by encoding (``python -m benchmarks bench watchers``).

Issue 55, item 1 asked whether gpufrac's pod watch should read protobuf, so that the API
server reuses for gpufrac the protobuf encoding it already makes for kube-scheduler's
informer instead of encoding every pod event a second time in JSON. This measures it
without scheduling anything: on a real control plane, ``--pods`` pods, a protobuf pod
watch standing in for kube-scheduler's, and in turn, per round:

- ``kube-scheduler's watch``: that watch alone;
- ``+ JSON watch``: a second watch in JSON (gpufrac's today);
- ``+ protobuf watch``: a second watch in protobuf.

Each setup then patches an annotation of the pods ``--updates`` times (8 clients), so every
watch receives one MODIFIED event per update; the API server's CPU (``/proc``) from the
first patch until 0.5 s after the last, per update, is the setup's number. The watches are
``benchmarks.pod_watcher`` processes (events read and dropped: the watcher's own decoding
is not in the number). Writes JSON after every setup; prints medians over the rounds.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.bench_scheduler import make_pod
from benchmarks.pod_watcher import start_watcher
from benchmarks.procstat import cpu_s
from benchmarks.replay import source_commit
from harness.controlplane import ControlPlane

SETUPS = {"kube-scheduler's watch": None, "+ JSON watch": "json", "+ protobuf watch": "protobuf"}
"""Setup name -> the encoding of the second watch (None: none)."""
NAMESPACE = "bench-watchers"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks bench watchers``."""
    p.add_argument("--pods", type=int, default=200, help="pods whose annotation is patched in turn")
    p.add_argument("--updates", type=int, default=2000, help="pod updates per setup and round")
    p.add_argument("--rounds", type=int, default=5, help="times the setups run in turn")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/watch-encoding.json"))


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Setup -> median over the rounds of the API server's CPU per update, ms."""
    return {s: statistics.median(r["apiserver_ms_per_update"] for r in rows if r["setup"] == s)
            for s in SETUPS if any(r["setup"] == s for r in rows)}


def _updates(api: client.CoreV1Api, pods: int, updates: int, tag: str) -> None:
    def patch(i: int) -> None:
        api.patch_namespaced_pod(f"p{i % pods:05d}", NAMESPACE,
                                 {"metadata": {"annotations": {"gpufrac.io/bench-update": f"{tag}-{i}"}}})

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(patch, range(updates)))


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a Markdown table; write JSON."""
    meta = {"machine": f"{platform.machine()}, {platform.system()}", "commit": source_commit(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "pods": args.pods, "updates": args.updates,
            "rounds": args.rounds}
    rows: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpufrac-bench-") as tmp:
        cp = ControlPlane.up(Path(tmp))
        try:
            api = client.CoreV1Api(config.new_client_from_config(config_file=str(cp.admin_kubeconfig)))
            api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
            with cf.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: api.create_namespaced_pod(NAMESPACE, make_pod(f"p{i:05d}", "watchers")),
                              range(args.pods)))
            apiserver = next(p for p in cp.procs if p.name == "kube-apiserver").popen.pid
            start_watcher(cp, "protobuf", "pod-watcher-protobuf-0")  # kube-scheduler's informer
            for round_ in range(args.rounds):
                for setup, encoding in SETUPS.items():
                    second = (start_watcher(cp, encoding, f"pod-watcher-{encoding}-{len(rows) + 1}")
                              if encoding else None)
                    time.sleep(2)  # its list and watch are up
                    before = cpu_s(apiserver)
                    _updates(api, args.pods, args.updates, f"{round_}-{setup}")
                    time.sleep(0.5)  # the last events delivered
                    used = cpu_s(apiserver) - before
                    if second is not None:
                        second.stop()
                    rows.append({"setup": setup, "round": round_,
                                 "apiserver_ms_per_update": 1000 * used / args.updates})
                    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
                    print(f"round {round_}  {setup:<24} {rows[-1]['apiserver_ms_per_update']:.3f} ms of API "
                          "server per update", flush=True)
        finally:
            cp.down()
    medians = summary(rows)
    print("\n| setup | API server CPU per pod update, ms (median) | rounds |")
    print("|---|---|---|")
    for setup, ms in medians.items():
        each = ", ".join(f"{r['apiserver_ms_per_update']:.2f}" for r in rows if r["setup"] == setup)
        print(f"| {setup} | {ms:.2f} | {each} |")
    return 0
