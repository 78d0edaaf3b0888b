"""Pods/s through the real kube-scheduler: no extender, a no-op extender, and gpufrac.

One control plane (``harness.controlplane``: etcd, kube-apiserver, kube-scheduler built
from Go modules), one run, five setups side by side for each cluster size:

- ``no extender``: kube-scheduler with the project's profile and the ``extenders`` section
  removed;
- ``no-op extender``: ``benchmarks.noop_extender`` (filter passes all, prioritize scores 0,
  no bind verb): the cost of the protocol on the same HTTP stack;
- ``no-op binder``: the same with ``--bind``: it also answers ``bind`` with one Binding per
  pod through the ``kubernetes`` client, the least any extender that binds can do (gpufrac
  must bind: the Binding carries the allocation);
- ``gpufrac``: cluster mode, filter + prioritize + bind (one Binding carrying the allocation);
- ``gpufrac fenced``: the same with ``--fence-namespace`` (as deploy runs its replicas): each
  bind first writes its claim to the node's ledger by compare-and-swap, a second write.

Two more on request (``--setups``), not in the default run: ``no-op json watcher`` and
``no-op protobuf watcher``, the no-op extender with ``benchmarks.pod_watcher`` watching
every pod beside kube-scheduler: what a second pod watch costs the API server in each
encoding (issue 55, item 1).

For each, ``--pods`` fractional pods (0.25 GPU, 100m CPU) are created while no scheduler
runs, then kube-scheduler starts and a pod watch records when each pod is first seen bound.
Throughput = (bound - 1) / (last bound - first bound), so kube-scheduler's start-up is not
counted. Pods are force-deleted between setups. With ``--rounds N`` the setups run N
times in turn (no extender, no-op, no-op binder, gpufrac, gpufrac fenced, no extender, ...), so a slow spell of the
machine falls on all of them; the JSON is written after every setup.

With ``--transports http,tls`` each setup also runs with kube-scheduler calling its extender
over mutual TLS, as the chart deploys gpufrac (``harness.controlplane.ExtenderTls``), right
after the same setup over plain HTTP, so both see the same spell of the machine; each new
connection is then a handshake. Each row says its ``transport`` and counts the machine's
accepted TCP connections per bound pod (``tcp_passive_opens_per_pod``): kube-scheduler keeps
at most two idle connections to an extender, so a request sent while two are in flight opens
a third.

Run: ``python -m benchmarks bench scheduler [--nodes 50,500] [--pods 1000] [--rounds 1]
[--transports http,tls]``
(``--pods 1000,1000,300`` gives each size its own count.)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import platform
import signal
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from benchmarks.errors import UsageError
from benchmarks.extender_client import wait_ok, wait_scoring
from benchmarks.pod_watcher import start_watcher
from benchmarks.procstat import cpu_s
from benchmarks.replay import source_commit
from extender.cluster.protobuf_watch import KubeProtos, PodWatch
from harness.builds import kube_version
from harness.controlplane import ControlPlane, ExtenderTls, add_fake_node, fake_node_gpus
from harness.processes import LOOPBACK, free_port, start, wait_until

SCHEDULER = "gpufrac-scheduler"
SETUPS = ("no extender", "no-op extender", "no-op binder", "gpufrac", "gpufrac fenced")
WATCHER_SETUPS = {"no-op json watcher": "json", "no-op protobuf watcher": "protobuf"}
"""The setups run only when named: the no-op extender with a second pod watch (``pod_watcher``)."""


def make_pod(name: str, group: str) -> client.V1Pod:
    """A 0.25-GPU pod for the benchmark's node group."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations={"gpufrac.io/fraction": "0.25"}),
        spec=client.V1PodSpec(
            scheduler_name=SCHEDULER, node_selector={"gpufrac.io/bench": group},
            termination_grace_period_seconds=0,
            containers=[client.V1Container(name="main", image="registry.k8s.io/pause:3.10",
                                           resources=client.V1ResourceRequirements(
                                               requests={"cpu": "100m", "memory": "64Mi"},
                                               limits={"gpufrac.io/gpu": "1"}))]))


def watch_binds(api: client.CoreV1Api, namespace: str, expected: int, stop: threading.Event,
                out: dict[str, float]) -> None:
    """Record ``time.monotonic()`` of each pod's first bound event into ``out``.

    The watch reads protobuf, as kube-scheduler's informer does, so that the API server
    encodes no pod event in JSON for the benchmark itself: a JSON watch here would make the
    API server's JSON encoding free for a JSON watcher under test (it encodes each event once
    per encoding, for every watcher of that encoding; ``bench watchers``).
    """
    w = PodWatch(KubeProtos())
    rv = api.list_namespaced_pod(namespace, limit=1).metadata.resource_version
    while not stop.is_set() and len(out) < expected:
        try:
            for ev in w.stream(partial(api.list_namespaced_pod, namespace), resource_version=rv,
                               timeout_seconds=5):
                obj = ev["object"]
                rv = obj["metadata"].get("resourceVersion", rv)
                if (obj.get("spec") or {}).get("nodeName"):
                    out.setdefault(obj["metadata"]["name"], time.monotonic())
                if len(out) >= expected or stop.is_set():
                    w.stop()
                    break
        except ApiException:
            # A loaded apiserver's watch cache may lag ("Too large resource version"): retry.
            time.sleep(0.2)


def tcp_passive_opens() -> int:
    """The machine's TCP connections accepted so far (``PassiveOpens`` in ``/proc/net/snmp``;
    every process counts, so only a difference over one setup says anything)."""
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Tcp:")]
    return int(lines[1][lines[0].index("PassiveOpens")])


def run_setup(cp: ControlPlane, api: client.CoreV1Api, setup: str, group: str, n_pods: int,
              timeout_s: float, round_: int = 0, tls: ExtenderTls | None = None) -> dict[str, Any]:
    """One setup on one node group: create pods, start scheduler (+extender), time the binds
    (``tls``: kube-scheduler calls the extender over mutual TLS)."""
    ns = f"bench-{group}-{setup.replace(' ', '-')}-{round_}" + ("-tls" if tls is not None else "")
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    extender = None
    scoring = None
    port = free_port()
    scheme = "https" if tls is not None else "http"
    verify = tls.client_context() if tls is not None else True
    if setup in ("gpufrac", "gpufrac fenced"):
        fence = ["--fence-namespace", ns] if setup == "gpufrac fenced" else []
        extender = cp.start_gpufrac(port, extra=["--inventory-stale-after-s", "3600", "--log-level", "warning",
                                                 *fence], tls=tls)
        scoring = wait_scoring(extender.popen, f"{scheme}://{LOOPBACK}:{port}", timeout_s, verify)
    elif setup in ("no-op extender", "no-op binder") or setup in WATCHER_SETUPS:
        bind = ["--bind", str(cp.admin_kubeconfig)] if setup == "no-op binder" else []
        serve_tls = ["--tls", str(tls.cert), str(tls.key), str(tls.client_ca)] if tls is not None else []
        extender = cp.track(start("noop-extender", [sys.executable, "-m", "benchmarks", "noop-extender",
                                                    str(port), *bind, *serve_tls], cp.workdir))
        wait_ok(extender.popen, f"{scheme}://{LOOPBACK}:{port}/healthz", 30, "no-op extender", verify)
    second_watch = None
    if setup in WATCHER_SETUPS:
        second_watch = start_watcher(cp, WATCHER_SETUPS[setup])
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: api.create_namespaced_pod(ns, make_pod(f"p{i:05d}", group)), range(n_pods)))
    bound: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_binds, args=(api, ns, n_pods, stop, bound), daemon=True)
    watcher.start()
    url = None if setup == "no extender" else f"{scheme}://{LOOPBACK}:{port}"
    drop = ("bindVerb",) if setup == "no-op extender" or setup in WATCHER_SETUPS else ()
    # CPU of the control plane and of the extender while this setup schedules (from the
    # scheduler's start to the last bind; gpufrac's compile of its scoring kernels has ended
    # before: wait_scoring), and of the scheduler over its whole life.
    plane = {p.name: p.popen.pid for p in cp.procs if p.name in ("etcd", "kube-apiserver")}
    plane_before = {name: cpu_s(pid) for name, pid in plane.items()}
    extender_before = cpu_s(extender.popen.pid) if extender is not None else 0.0
    opens_before = tcp_passive_opens()
    sched = cp.start_scheduler(url, name=f"kube-scheduler-{ns}", qps=1000, drop_verbs=drop, extender_tls=tls)
    deadline = time.monotonic() + timeout_s
    while len(bound) < n_pods and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    opens = tcp_passive_opens() - opens_before
    cpu = {name: cpu_s(pid) - plane_before[name] for name, pid in plane.items()}
    cpu["kube-scheduler"] = cpu_s(sched.popen.pid)
    cpu["extender"] = cpu_s(extender.popen.pid) - extender_before if extender is not None else 0.0
    sched.stop()
    if extender is not None:
        extender.stop()
    if second_watch is not None:
        second_watch.stop()
    times = sorted(bound.values())
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_until(lambda: not api.list_namespaced_pod(ns, limit=1).items, 120, f"pods of {ns} deleted")
    per_pod = {f"cpu_ms_per_pod_{name}": 1000 * s / max(len(times), 1) for name, s in cpu.items()}
    return {"setup": setup, "scoring": scoring, "pods": n_pods, "bound": len(times), "pods_per_s": rate,
            "bind_window_s": times[-1] - times[0] if times else 0.0,
            "tcp_passive_opens_per_pod": opens / max(len(times), 1), **per_pod,
            "cpu_ms_per_pod_total": sum(per_pod.values())}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks bench scheduler``."""
    p.add_argument("--nodes", default="50,500", help="cluster sizes, comma-separated")
    p.add_argument("--pods", default="1000", help="pods per setup: one count, or one per size")
    p.add_argument("--rounds", type=int, default=1, help="times the setups run in turn per size")
    p.add_argument("--setups", default=",".join(SETUPS), help="which setups, comma-separated, in run order")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--transports", default="http",
                   help="how kube-scheduler calls the extenders, comma-separated, each setup in turn: http "
                        "(plain, on loopback), tls (mutual TLS, as the chart deploys gpufrac)")
    p.add_argument("--timeout-s", type=float, default=300)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/scheduler-throughput.json"))


def run(args: argparse.Namespace) -> int:
    """Run ``python -m benchmarks bench scheduler``."""
    sizes = [int(x) for x in args.nodes.split(",")]
    setups = args.setups.split(",")
    if unknown := set(setups) - set(SETUPS) - set(WATCHER_SETUPS):
        raise UsageError(f"--setups: unknown {sorted(unknown)}; choose from {[*SETUPS, *WATCHER_SETUPS]}")
    transports = args.transports.split(",")
    if unknown := set(transports) - {"http", "tls"}:
        raise UsageError(f"--transports: unknown {sorted(unknown)}; choose from ['http', 'tls']")
    counts = [int(x) for x in args.pods.split(",")]
    if len(counts) not in (1, len(sizes)):
        raise UsageError("--pods: one count, or one per size")
    pods_for = dict(zip(sizes, counts * len(sizes) if len(counts) == 1 else counts, strict=True))
    meta = {"kubernetes": kube_version(), "python": platform.python_version(),
            "machine": f"{platform.machine()}, {platform.system()}", "commit": source_commit(),
            "pods": args.pods, "rounds": args.rounds, "transports": transports}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # SIGTERM (a timeout, a Ctrl-C from a supervisor) still stops every process by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpufrac-bench-") as tmp:
        cp = ControlPlane.up(Path(tmp))
        try:
            api = client.CoreV1Api(config.new_client_from_config(config_file=str(cp.admin_kubeconfig)))
            tls = cp.extender_tls()
            for size in sizes:
                group = f"n{size}"
                with cf.ThreadPoolExecutor(8) as pool:
                    def node(i: int, group: str = group) -> None:
                        name = f"{group}-{i:04d}"
                        add_fake_node(api, name, fake_node_gpus(name, args.gpus_per_node, replicas=8),
                                      cpu="64", memory="256Gi")
                        api.patch_node(name, {"metadata": {"labels": {"gpufrac.io/bench": group}}})
                    list(pool.map(node, range(size)))
                for round_ in range(args.rounds):
                    for setup, transport in ((s, t) for s in setups for t in transports):
                        row = run_setup(cp, api, setup, group, pods_for[size], args.timeout_s, round_,
                                        tls if transport == "tls" else None)
                        row["nodes"], row["round"], row["transport"] = size, round_, transport
                        rows.append(row)
                        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
                        print(f"{size:>5} nodes  {setup:<15} {transport:<4} {row['bound']}/{row['pods']} bound  "
                              f"{row['pods_per_s']:7.1f} pods/s  CPU/pod {row['cpu_ms_per_pod_total']:.1f} ms",
                              flush=True)
                # The next size starts from an empty cluster.
                api.delete_collection_node(label_selector=f"gpufrac.io/bench={group}")
        finally:
            cp.down()
    print("\n| nodes | setup | transport | pods/s | CPU ms per bound pod: apiserver / etcd / scheduler / extender / "
          "total | new connections per pod |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['setup']} | {r['transport']} | {r['pods_per_s']:.1f} | "
              f"{r['cpu_ms_per_pod_kube-apiserver']:.1f} / {r['cpu_ms_per_pod_etcd']:.1f} / "
              f"{r['cpu_ms_per_pod_kube-scheduler']:.1f} / {r['cpu_ms_per_pod_extender']:.1f} / "
              f"{r['cpu_ms_per_pod_total']:.1f} | {r['tcp_passive_opens_per_pod']:.2f} |")
    return 0

