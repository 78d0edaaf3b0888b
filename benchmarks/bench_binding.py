"""What one Binding costs the process that writes it, by HTTP client (``python -m benchmarks bench binding``).

gpufrac's bind writes one Binding per pod (its allocation record as annotations). Until
decision record 0033 it was written through the ``kubernetes`` client's urllib3 pool from a
worker thread; ``extender.cluster.loop_api.LoopApi`` writes it from the event loop. This
measures the candidates side by side on a real control plane, each writing the same
Bindings (``--pods`` pending pods per setup and round, bound to one fake node, ``--concurrency``
in flight at once from one asyncio loop, as kube-scheduler's binds arrive):

- ``kubernetes client in a worker``: ``podspec.kubeio.write_json`` through
  ``asyncio.to_thread``, what the bind did before;
- ``LoopApi``: what it does now;
- ``aiohttp``: ``aiohttp.ClientSession`` (installed with the ``kubernetes`` client);
- ``httpx``: ``httpx.AsyncClient`` (the benchmark extra).

Per setup: this process's CPU (``time.process_time``, every thread) and the API server's and
etcd's (``/proc``) from the first write to the last answer, per Binding. Writes JSON after
every setup; prints medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import datetime as dt
import json
import platform
import ssl
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from kubernetes import client

from benchmarks.bench_scheduler import make_pod
from benchmarks.errors import UsageError
from benchmarks.procstat import cpu_s
from benchmarks.replay import source_commit
from extender.cluster.loop_api import LoopApi
from extender.cluster.pod_api import binding
from harness.controlplane import ControlPlane, add_fake_node, fake_node_gpus
from podspec.kubeio import kube_api, write_json
from podspec.pods import allocation_annotations

SETUPS = ("kubernetes client in a worker", "LoopApi", "aiohttp", "httpx")
NODE = "bench-binding-node"
TIMEOUT_S = 30.0
HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}

Write = Callable[[str, dict[str, Any]], Awaitable[None]]
"""``write(path, body)``: one Binding written."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks bench binding``."""
    p.add_argument("--pods", type=int, default=1000, help="Bindings per setup and round")
    p.add_argument("--concurrency", type=int, default=4, help="Bindings in flight at once")
    p.add_argument("--rounds", type=int, default=3, help="times the setups run in turn")
    p.add_argument("--setups", default=",".join(SETUPS), help="which setups, comma-separated, in run order")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/binding-clients.json"))


def _tls(cfg: client.Configuration) -> ssl.SSLContext:
    tls = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    if cfg.cert_file:
        tls.load_cert_chain(cfg.cert_file, cfg.key_file)
    return tls


async def _write_all(make: Callable[[], Any], bodies: list[tuple[str, dict[str, Any]]], concurrency: int) -> None:
    """Open a client (``make``: an async context manager yielding a ``Write``) and write every body."""
    slots = asyncio.Semaphore(concurrency)
    async with make() as write:
        async def one(path: str, body: dict[str, Any]) -> None:
            async with slots:
                await write(path, body)
        await asyncio.gather(*(one(p, b) for p, b in bodies))


class _Client:
    """Each setup's client as an async context manager yielding its ``Write``."""

    def __init__(self, setup: str, api: client.CoreV1Api) -> None:
        self.setup, self.api = setup, api
        self.cfg = api.api_client.configuration
        self.close: Callable[[], Awaitable[None]] | None = None

    async def __aenter__(self) -> Write:
        return {"kubernetes client in a worker": self._worker, "LoopApi": self._loop_api,
                "aiohttp": self._aiohttp, "httpx": self._httpx}[self.setup]()

    async def __aexit__(self, *exc: object) -> None:
        if self.close is not None:
            await self.close()

    def _worker(self) -> Write:
        api = self.api

        async def write(path: str, body: dict[str, Any]) -> None:
            await asyncio.to_thread(write_json, api, "POST", path, body, TIMEOUT_S)
        return write

    def _loop_api(self) -> Write:
        loop_api = LoopApi.for_client(self.api)
        assert loop_api is not None

        async def write(path: str, body: dict[str, Any]) -> None:
            await loop_api.write_json("POST", path, body, TIMEOUT_S)

        async def close() -> None:
            loop_api.close()
        self.close = close
        return write

    def _aiohttp(self) -> Write:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_tls(self.cfg), limit=16))
        host = self.cfg.host
        self.close = session.close

        async def write(path: str, body: dict[str, Any]) -> None:
            async with session.post(host + path, data=orjson.dumps(body), headers=HEADERS) as r:
                await r.read()
                assert 200 <= r.status <= 299, r.status
        return write

    def _httpx(self) -> Write:
        http = httpx.AsyncClient(verify=_tls(self.cfg), limits=httpx.Limits(max_connections=16))
        host = self.cfg.host
        self.close = http.aclose

        async def write(path: str, body: dict[str, Any]) -> None:
            r = await http.post(host + path, content=orjson.dumps(body), headers=HEADERS)
            assert 200 <= r.status_code <= 299, r.status_code
        return write


def run_setup(cp: ControlPlane, api: client.CoreV1Api, setup: str, pods: int, concurrency: int,
              round_: int) -> dict[str, Any]:
    """Create ``pods`` pending pods, then bind them all with ``setup``'s client; the costs."""
    ns = f"bench-binding-{round_}-{SETUPS.index(setup)}"
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    with cf.ThreadPoolExecutor(8) as pool:
        created = list(pool.map(lambda i: api.create_namespaced_pod(ns, make_pod(f"p{i:05d}", "none")), range(pods)))
    record = allocation_annotations(["GPU-bench-0"], 250, [4096], dt.datetime.now(dt.UTC))
    bodies = [binding(p.metadata.uid, ns, p.metadata.name, NODE, record) for p in created]
    time.sleep(1.0)  # the creations' watch events settle
    plane = {p.name: p.popen.pid for p in cp.procs if p.name in ("etcd", "kube-apiserver")}
    before = {n: cpu_s(pid) for n, pid in plane.items()}
    t0, w0 = time.process_time(), time.monotonic()
    asyncio.run(_write_all(lambda: _Client(setup, api), bodies, concurrency))
    own, wall = time.process_time() - t0, time.monotonic() - w0
    spent = {n: cpu_s(pid) - before[n] for n, pid in plane.items()}
    api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    return {"setup": setup, "round": round_, "pods": pods, "concurrency": concurrency,
            "client_us_per_binding": 1e6 * own / pods, "wall_us_per_binding": 1e6 * wall / pods,
            **{f"{n}_us_per_binding": 1e6 * s / pods for n, s in spent.items()}}


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Setup -> median of ``key`` over the rounds."""
    return {s: statistics.median(r[key] for r in rows if r["setup"] == s)
            for s in SETUPS if any(r["setup"] == s for r in rows)}


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a Markdown table; write JSON."""
    setups = args.setups.split(",")
    if unknown := set(setups) - set(SETUPS):
        raise UsageError(f"--setups: unknown {sorted(unknown)}; choose from {list(SETUPS)}")
    meta = {"machine": f"{platform.machine()}, {platform.system()}", "python": platform.python_version(),
            "commit": source_commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()), "pods": args.pods,
            "concurrency": args.concurrency, "rounds": args.rounds}
    rows: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpufrac-bench-") as tmp:
        cp = ControlPlane.up(Path(tmp))
        try:
            api = kube_api(cp.admin_kubeconfig)
            add_fake_node(api, NODE, fake_node_gpus(NODE, 8, replicas=8), cpu="100000", memory="100000Gi",
                          pods=1_000_000)
            for round_ in range(args.rounds):
                for setup in setups:
                    row = run_setup(cp, api, setup, args.pods, args.concurrency, round_)
                    rows.append(row)
                    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
                    print(f"round {round_}  {setup:<30} client {row['client_us_per_binding']:6.0f} us  "
                          f"API server {row['kube-apiserver_us_per_binding']:6.0f} us  "
                          f"etcd {row['etcd_us_per_binding']:5.0f} us a Binding", flush=True)
        finally:
            cp.down()
    client_us, api_us = summary(rows, "client_us_per_binding"), summary(rows, "kube-apiserver_us_per_binding")
    etcd_us = summary(rows, "etcd_us_per_binding")
    print("\n| client | its CPU per Binding, us (median) | API server, us | etcd, us | rounds (its CPU) |")
    print("|---|---|---|---|---|")
    for s in client_us:
        per_round = ", ".join(f"{r['client_us_per_binding']:.0f}" for r in rows if r["setup"] == s)
        print(f"| {s} | {client_us[s]:.0f} | {api_us[s]:.0f} | {etcd_us[s]:.0f} | {per_round} |")
    return 0
