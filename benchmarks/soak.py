"""Soak: pods created and deleted for minutes through the real control plane, with a fault
every minute; afterwards no over-commit, no leaked hold, every pod bound or told why not.

One control plane (``harness.controlplane``: etcd, kube-apiserver, kube-scheduler with
the project's ``scheduler-config.yaml``), ``--nodes`` fake nodes of 8 GPUs (4 replica slots
each), and gpufrac in cluster mode with fenced binds, as ``deploy/`` runs it. A creator
thread creates ``--pods`` pods at an even pace over ``--minutes`` (shapes drawn, seeded,
from 0.1 / 0.25 / 0.5 / 1 / 2 / 4 GPUs); each pod is deleted ``--lifetime-s`` (uniform
within +-50 %) after it was seen bound. Every ``--fault-every-s`` seconds one fault, in
turn:

1. ``apiserver``: kube-apiserver restarted (SIGTERM, start again, same etcd);
2. ``gpufrac-kill``: gpufrac SIGKILLed and started again 2 s later (what kubelet does);
3. ``node-readd``: a node holding pods deleted with its pods (the pod GC's part), re-added
   10 s later with the same inventory;
4. ``inventory-invalid``: a node's ``gpufrac.io/inventory`` replaced by garbage for 20 s,
   then restored.

Sampled every 5 s: gpufrac's RSS, the pods bound in the last interval and their median
and p99 time from creation to bound, pods pending, and ``check_invariants`` over the API
(every GPU's share, memory and replica slots within bounds) every 30 s. At the end the
creator stops, the remaining pods get ``--drain-s`` to bind, then every pod is deleted,
and after the claim TTL gpufrac must hold nothing (``/allocations`` empty, no GPU share
allocated). Every pod never bound must have a FailedScheduling event (a reason).

Writes ``result.json`` (summary, faults, time series) and ``soak.png`` (RSS, bind latency,
throughput and pending pods over time, faults marked) to ``--out``.

Run: ``python -m benchmarks soak [--pods 10000] [--minutes 10] [--nodes 500] --out DIR``
(quick: ``--pods 600 --minutes 2 --nodes 40``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import platform
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from benchmarks.replay import source_commit
from extender.cluster import raw_watch_target
from harness.controlplane import ControlPlane, add_fake_node, fake_node_gpus
from harness.invariants import check_invariants
from harness.processes import LOOPBACK, Proc, free_port

SCHEDULER = "gpufrac-scheduler"
NAMESPACE = "soak"
FENCE_NAMESPACE = "gpufrac-soak"
CLAIM_TTL_S = 20.0
SHAPES: tuple[tuple[int, str | None, float], ...] = (
    (1, "0.1", 0.15), (1, "0.25", 0.3), (1, "0.5", 0.2), (1, None, 0.2), (2, None, 0.1), (4, None, 0.05))
"""(gpufrac.io/gpu, gpufrac.io/fraction or None for whole GPUs, weight)."""
FAULTS = ("apiserver", "gpufrac-kill", "node-readd", "inventory-invalid")


@dataclass
class Soak:
    """The running soak: control plane, gpufrac, the pods' timeline."""

    cp: ControlPlane
    api: client.CoreV1Api
    port: int
    gpufrac: Proc
    nodes: list[str]
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start_gpufrac(self) -> Proc:
        self.gpufrac = self.cp.start_gpufrac(self.port, extra=[
            "--inventory-stale-after-s", "3600", "--fence-namespace", FENCE_NAMESPACE,
            "--claim-ttl-s", str(CLAIM_TTL_S), "--log-level", "warning"])
        return self.gpufrac


def retry(fn: Any, *args: Any, tries: int = 60, **kw: Any) -> Any:
    """``fn(*args, **kw)``, retried every 0.5 s while the API server is away (bounded)."""
    for i in range(tries):
        try:
            return fn(*args, **kw)
        except ApiException as exc:
            if exc.status in (404, 409) or i == tries - 1:
                raise
        except Exception:  # noqa: BLE001 - connection refused while the API server restarts
            if i == tries - 1:
                raise
        time.sleep(0.5)
    return None


def pod(name: str, gpus: int, fraction: str | None) -> client.V1Pod:
    annotations = {"gpufrac.io/fraction": fraction} if fraction else {}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            scheduler_name=SCHEDULER, termination_grace_period_seconds=0,
            containers=[client.V1Container(name="main", image="registry.k8s.io/pause:3.10",
                                           resources=client.V1ResourceRequirements(
                                               requests={"cpu": "100m", "memory": "128Mi"},
                                               limits={"gpufrac.io/gpu": str(gpus)}))]))


def watch_pods(s: Soak) -> None:
    """Record when each pod is first seen bound (and where); resumes after API restarts."""
    while not s.stop.is_set():
        try:
            w = watch.Watch()
            for ev in w.stream(raw_watch_target(s.api.list_namespaced_pod), NAMESPACE, timeout_seconds=30):
                obj = ev["object"]
                name = obj["metadata"]["name"]
                node = obj.get("spec", {}).get("nodeName")
                if node:
                    with s.lock:
                        if name not in s.bound:
                            s.bound[name] = time.monotonic()
                            s.node_of[name] = node
                if s.stop.is_set():
                    w.stop()
        except Exception:  # noqa: BLE001 - the API server restarts during the soak
            time.sleep(0.5)


def create_pods(s: Soak, total: int, seconds: float, rng: random.Random) -> None:
    weights = [w for _, _, w in SHAPES]
    start = time.monotonic()
    with cf.ThreadPoolExecutor(4) as pool:
        for i in range(total):
            due = start + seconds * i / total
            while time.monotonic() < due:
                time.sleep(min(0.05, due - time.monotonic()))
            if s.stop.is_set():
                return
            gpus, fraction, _ = rng.choices(SHAPES, weights)[0]
            name = f"s{i:05d}"
            with s.lock:
                s.created[name] = time.monotonic()
            pool.submit(retry, s.api.create_namespaced_pod, NAMESPACE, pod(name, gpus, fraction))


def delete_expired(s: Soak, lifetime_s: float, rng: random.Random) -> None:
    """Delete each pod ``lifetime_s`` (+-50 %) after it was seen bound."""
    due: dict[str, float] = {}
    with cf.ThreadPoolExecutor(4) as pool:
        while not s.stop.wait(0.5):
            now = time.monotonic()
            with s.lock:
                for name, t in s.bound.items():
                    if name not in due and name not in s.deleted:
                        due[name] = t + lifetime_s * rng.uniform(0.5, 1.5)
                expired = [n for n, t in due.items() if t <= now and n not in s.deleted]
                s.deleted.update(expired)
            for name in expired:
                pool.submit(_delete, s, name)


def _delete(s: Soak, name: str) -> None:
    try:
        retry(s.api.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0)
    except ApiException:
        pass


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def inject(s: Soak, fault: str, rng: random.Random) -> str:
    """Apply one fault; a short description of what was done."""
    if fault == "apiserver":
        s.cp.restart("kube-apiserver")
        return "kube-apiserver restarted"
    if fault == "gpufrac-kill":
        s.gpufrac.kill()
        s.cp.procs.remove(s.gpufrac)
        time.sleep(2)
        s.start_gpufrac()
        return "gpufrac SIGKILLed, started again after 2 s"
    with s.lock:
        busy = sorted({n for p, n in s.node_of.items() if p not in s.deleted})
    node = rng.choice(busy or s.nodes)
    if fault == "node-readd":
        on_node = [p.metadata.name for p in retry(s.api.list_namespaced_pod, NAMESPACE).items
                   if p.spec.node_name == node]
        retry(s.api.delete_node, node)
        with s.lock:
            s.deleted.update(on_node)
        for name in on_node:
            _delete(s, name)
        time.sleep(10)
        retry(add_fake_node, s.api, node, fake_node_gpus(node, 8, replicas=4), cpu="96", memory="512Gi")
        return f"node {node} deleted with its {len(on_node)} pods, re-added after 10 s"
    good = retry(s.api.read_node, node).metadata.annotations["gpufrac.io/inventory"]
    retry(s.api.patch_node, node, {"metadata": {"annotations": {"gpufrac.io/inventory": "{garbage"}}})
    time.sleep(20)
    retry(s.api.patch_node, node, {"metadata": {"annotations": {"gpufrac.io/inventory": good}}})
    return f"node {node}'s inventory invalid for 20 s"


def never_bound_without_reason(s: Soak) -> list[str]:
    """Pods still pending at the end that have no FailedScheduling event."""
    pending = [p.metadata.name for p in retry(s.api.list_namespaced_pod, NAMESPACE).items if not p.spec.node_name]
    events = retry(s.api.list_namespaced_event, NAMESPACE, field_selector="reason=FailedScheduling").items
    told = {e.involved_object.name for e in events if e.message}
    return [n for n in pending if n not in told]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        cp = ControlPlane.up(Path(tmp))
        try:
            return _run(args, cp, out, rng)
        finally:
            cp.down()


def _run(args: argparse.Namespace, cp: ControlPlane, out: Path, rng: random.Random) -> int:
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(cp.admin_kubeconfig)))
    for ns in (NAMESPACE, FENCE_NAMESPACE):
        api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    nodes = [f"soak-{i:04d}" for i in range(args.nodes)]
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: add_fake_node(api, n, fake_node_gpus(n, 8, replicas=4), cpu="96",
                                              memory="512Gi"), nodes))
    s = Soak(cp, api, free_port(), None, nodes)  # type: ignore[arg-type]
    s.start_gpufrac()
    cp.start_scheduler(s.url, qps=200)
    threads = [threading.Thread(target=watch_pods, args=(s,), daemon=True),
               threading.Thread(target=delete_expired, args=(s, args.lifetime_s, random.Random(args.seed + 1)),
                                daemon=True)]
    for t in threads:
        t.start()
    creator = threading.Thread(target=create_pods, args=(s, args.pods, args.minutes * 60, random.Random(args.seed)),
                               daemon=True)
    t0 = time.monotonic()
    creator.start()
    series: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    violations: list[dict[str, Any]] = []
    next_fault, next_check, last_sample, k = t0 + args.fault_every_s, t0 + 30, t0, 0
    fault_thread: threading.Thread | None = None
    while creator.is_alive() or time.monotonic() - t0 < args.minutes * 60:
        time.sleep(5)
        now = time.monotonic()
        with s.lock:
            window = [s.bound[n] - s.created[n] for n in s.bound if last_sample < s.bound[n] <= now and n in s.created]
            pending = sum(1 for n in s.created if n not in s.bound and n not in s.deleted)
        window.sort()
        series.append({"t_s": round(now - t0, 1), "rss_mib": round(rss_mib(s.gpufrac.popen.pid), 1),
                       "bound": len(window), "pending": pending,
                       "latency_p50_s": round(window[len(window) // 2], 3) if window else None,
                       "latency_p99_s": round(window[int(0.99 * (len(window) - 1))], 3) if window else None})
        last_sample = now
        if now >= next_check:
            try:
                problems = check_invariants(api)
            except Exception as exc:  # noqa: BLE001 - the API server may be restarting
                problems = None
                print(f"  invariants not checked at {now - t0:.0f} s: {type(exc).__name__}")
            if problems:
                violations.append({"t_s": round(now - t0, 1), "problems": problems[:20]})
            next_check = now + 30
        if now >= next_fault and (fault_thread is None or not fault_thread.is_alive()):
            fault = FAULTS[k % len(FAULTS)]
            k += 1
            record: dict[str, Any] = {"t_s": round(now - t0, 1), "fault": fault}
            faults.append(record)

            def apply(record: dict[str, Any] = record, fault: str = fault) -> None:
                record["what"] = inject(s, fault, rng)
                record["done_s"] = round(time.monotonic() - t0, 1)

            fault_thread = threading.Thread(target=apply, daemon=True)
            fault_thread.start()
            next_fault = now + args.fault_every_s
        print(f"  t={now - t0:5.0f}s bound {len(s.bound):5d} pending {pending:4d} "
              f"rss {series[-1]['rss_mib']:.0f} MiB faults {len(faults)}", flush=True)
    if fault_thread is not None:
        fault_thread.join(120)
    # Drain: the pods left get time to bind; then who never bound must have been told why.
    deadline = time.monotonic() + args.drain_s
    while time.monotonic() < deadline:
        with s.lock:
            left = [n for n in s.created if n not in s.bound and n not in s.deleted]
        if not left:
            break
        time.sleep(2)
    unexplained = never_bound_without_reason(s)
    final_problems = check_invariants(api)
    s.stop.set()
    # Everything deleted: after the claim TTL and an expiry pass, gpufrac must hold nothing.
    for p in retry(api.list_namespaced_pod, NAMESPACE).items:
        _delete(s, p.metadata.name)
    time.sleep(CLAIM_TTL_S + 5)
    allocations = httpx.get(f"{s.url}/allocations", timeout=30).json()
    leaked = [a for a in allocations if a["namespace"] == NAMESPACE]
    metrics = httpx.get(f"{s.url}/metrics", timeout=30).text
    allocated = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("gpufrac_gpu_allocated_milli{"))
    summary = {
        "pods_created": len(s.created), "pods_bound": len(s.bound),
        "pods_never_bound": len(s.created) - len(s.bound),
        "pods_never_bound_without_reason": unexplained[:50], "faults": len(faults),
        "invariant_violations_during": violations, "invariant_violations_at_end": final_problems,
        "leaked_allocations": leaked, "gpu_allocated_milli_after_delete": allocated,
        "rss_mib_first_last_max": [series[0]["rss_mib"], series[-1]["rss_mib"], max(x["rss_mib"] for x in series)],
        "latency_s_p50_p99_all": _percentiles([s.bound[n] - s.created[n] for n in s.bound if n in s.created]),
    }
    ok = not violations and not final_problems and not leaked and not unexplained and allocated == 0
    result = {"benchmark": "soak", "ok": ok,
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "func"},
              "commit": source_commit(), "machine": platform.platform(), "summary": summary,
              "faults": faults, "series": series}
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(series, faults, out / "soak.png")
    print(json.dumps(summary, indent=1))
    print(f"soak: {'OK' if ok else 'FAILED'}; {out / 'result.json'}, {out / 'soak.png'}")
    return 0 if ok else 1


def _percentiles(values: list[float]) -> list[float] | None:
    if not values:
        return None
    q = statistics.quantiles(values, n=100) if len(values) > 1 else [values[0]] * 99
    return [round(statistics.median(values), 3), round(q[98], 3)]


def _plot(series: list[dict[str, Any]], faults: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [x["t_s"] for x in series]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].plot(t, [x["rss_mib"] for x in series])
    axes[0].set_ylabel("gpufrac RSS (MiB)")
    axes[1].plot(t, [x["latency_p50_s"] for x in series], label="p50")
    axes[1].plot(t, [x["latency_p99_s"] for x in series], label="p99")
    axes[1].set_ylabel("created -> bound (s)")
    axes[1].legend()
    axes[2].plot(t, [x["bound"] / 5 for x in series], label="bound / s")
    axes[2].plot(t, [x["pending"] for x in series], label="pending")
    axes[2].set_ylabel("pods")
    axes[2].set_xlabel("seconds")
    axes[2].legend()
    for f in faults:
        for ax in axes:
            ax.axvline(f["t_s"], color="grey", linestyle=":", linewidth=0.8)
        axes[0].annotate(f["fault"], (f["t_s"], axes[0].get_ylim()[1]), rotation=90, fontsize=7, va="top")
    fig.suptitle("gpufrac soak: pods created and deleted, a fault every interval (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The soak's options."""
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--lifetime-s", type=float, default=60.0, help="mean seconds a pod lives once bound")
    parser.add_argument("--fault-every-s", type=float, default=60.0)
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/soak"))
