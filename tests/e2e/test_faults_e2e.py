"""The control plane fails under gpufrac (issue 38): real binaries, faults injected.

A control plane of its own (the session's other tests keep theirs): etcd, kube-apiserver,
kube-scheduler with the project's config, and gpufrac in cluster mode with fenced binds (as
deploy runs it). Faults: kube-apiserver restarted during a stream of binds, etcd stopped for
30 s, the API server slowed by a proxy, and a replica that died between writing its claim
and the Binding. Each time: ``/healthz`` answers throughout, binds that cannot be written
are refused with a message (never a 500, never half-written), gpufrac recovers without a
restart, and ``check_invariants`` over the API finds no over-commit, no lost and no doubled
allocation. The API server's restart is also met by a replica without a fence (its own
profile and nodes), whose Bindings go out from the event loop on kept-alive connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client, config

from extender.fence import ClaimFence
from harness.controlplane import ControlPlane
from harness.latency_proxy import LatencyProxy
from harness.processes import LOOPBACK, Proc, free_port, wait_until
from podspec.kubeio import kube_api
from tests.e2e.helpers import check_invariants, gpu_pod, make_nodes, new_namespace

pytestmark = pytest.mark.e2e

FENCE_NS = "gpufrac-faults"
CLAIM_TTL_S = 8.0


class Faults:
    """The fault-injection cluster: control plane, gpufrac (fenced) and kube-scheduler."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=str(cp.admin_kubeconfig)))
        new_namespace(self.api, FENCE_NS)
        self.port = free_port()
        self.gpufrac = self.start_gpufrac()
        self.scheduler = cp.start_scheduler(f"http://{LOOPBACK}:{self.port}", qps=100)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start_gpufrac(self, kubeconfig_path: Path | None = None) -> Proc:
        self.gpufrac = self.cp.start_gpufrac(self.port, kubeconfig_path=kubeconfig_path, extra=[
            "--inventory-stale-after-s", "600", "--fence-namespace", FENCE_NS,
            "--claim-ttl-s", str(CLAIM_TTL_S)])
        return self.gpufrac

    def bound(self, ns: str, count: int, timeout_s: float) -> list[Any]:
        def done() -> list[Any] | None:
            try:
                pods = self.api.list_namespaced_pod(ns).items
            except Exception:  # noqa: BLE001 - the API server may be coming back
                return None
            return pods if len(pods) == count and all(p.spec.node_name for p in pods) else None
        try:
            return list(wait_until(done, timeout_s, f"{count} pods of {ns} bound", interval_s=0.5))
        except Exception as exc:
            raise AssertionError(f"{exc}\n--- gpufrac ---\n{self.gpufrac.tail(3000)}\n"
                                 f"--- kube-scheduler ---\n{self.scheduler.tail(2000)}") from None

    def allocations(self, ns: str) -> dict[str, list[str]]:
        """gpufrac's allocations of ``ns``'s pods: pod name -> GPU UUIDs."""
        got = httpx.get(f"{self.url}/allocations", timeout=10).json()
        return {a["name"]: a["gpu_uuids"] for a in got if a["namespace"] == ns}

    def consistent(self, ns: str, pods: list[Any]) -> None:
        """Invariants over the API, and gpufrac's cache equal to the API's records."""
        assert check_invariants(self.api) == []
        recorded = {p.metadata.name: p.metadata.annotations["gpufrac.io/assigned-gpus"].split(",") for p in pods}
        wait_until(lambda: self.allocations(ns) == recorded, 30, "gpufrac's allocations equal to the API's records")


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    cp = ControlPlane.up(Path(tmp_path_factory.mktemp("faults")))
    try:
        yield Faults(cp)
    finally:
        cp.down()


@contextmanager
def health_probe(url: str) -> Iterator[list[str]]:
    """Poll ``/healthz`` every 0.2 s (2 s timeout) while the block runs; the failures."""
    failures: list[str] = []
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(timeout=2) as http:
            while not stop.wait(0.2):
                try:
                    r = http.get(f"{url}/healthz")
                    if r.status_code != 200:
                        failures.append(f"HTTP {r.status_code}")
                except httpx.HTTPError as exc:
                    failures.append(type(exc).__name__)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield failures
    finally:
        stop.set()
        t.join(5)


@contextmanager
def gpufrac_through(faults: Faults, delay_s: float, name: str) -> Iterator[LatencyProxy]:
    """gpufrac restarted to reach the API server through a ``LatencyProxy`` (``delay_s``), and
    restarted on the direct path afterwards."""
    api_port = int(faults.cp.server.rsplit(":", 1)[1])
    with LatencyProxy(api_port, delay_s=delay_s) as proxy:
        kc = yaml.safe_load(faults.cp.admin_kubeconfig.read_text())
        kc["clusters"][0]["cluster"]["server"] = f"https://{LOOPBACK}:{proxy.port}"
        via = faults.cp.workdir / f"{name}.kubeconfig"
        via.write_text(yaml.safe_dump(kc))
        faults.gpufrac.stop()
        faults.start_gpufrac(via)
        try:
            yield proxy
        finally:
            faults.gpufrac.stop()
            faults.start_gpufrac()


def create_pods(api: client.CoreV1Api, ns: str, group: str, names: list[str], **kw: Any) -> None:
    for name in names:
        wait_until(lambda n=name: api.create_namespaced_pod(ns, gpu_pod(n, group, **kw)), 60,
                   f"pod {ns}/{name} created", interval_s=0.5)


def test_api_server_restart_during_a_stream_of_binds(faults: Faults) -> None:
    group = "restart"
    make_nodes(faults.api, group, 6, gpus=2)
    ns = new_namespace(faults.api, "restart")
    with health_probe(faults.url) as failures:
        create_pods(faults.api, ns, group, [f"p{i:02d}" for i in range(12)], fraction="0.25")
        faults.cp.restart("kube-apiserver")  # binds in flight meet a closed connection
        create_pods(faults.api, ns, group, [f"p{i:02d}" for i in range(12, 24)], fraction="0.25")
        pods = faults.bound(ns, 24, 120)
    assert failures == []
    assert faults.gpufrac.popen.poll() is None  # recovered without a restart
    faults.consistent(ns, pods)


UNFENCED_PROFILE = "gpufrac-unfenced"


def test_api_server_restart_during_a_stream_of_unfenced_binds(faults: Faults) -> None:
    # One replica without a fence writes its Bindings from the event loop on kept-alive
    # connections (extender.cluster.loop_api): the restart closes them under binds in flight.
    # Its own profile and nodes, beside the module's fenced instance.
    group, port = "restart-unfenced", free_port()
    make_nodes(faults.api, group, 6, gpus=2)
    ns = new_namespace(faults.api, "restart-unfenced")
    gpufrac = faults.cp.start_gpufrac(port, name="gpufrac-unfenced", extra=[
        "--inventory-stale-after-s", "600", "--scheduler-name", UNFENCED_PROFILE])
    scheduler = faults.cp.start_scheduler(f"http://{LOOPBACK}:{port}", name="kube-scheduler-unfenced", qps=100,
                                          profile=UNFENCED_PROFILE)
    try:
        names = [f"p{i:02d}" for i in range(24)]
        with health_probe(f"http://{LOOPBACK}:{port}") as failures:
            create_pods(faults.api, ns, group, names[:12], fraction="0.25", scheduler=UNFENCED_PROFILE)
            faults.cp.restart("kube-apiserver")  # the kept-alive connections close under binds in flight
            create_pods(faults.api, ns, group, names[12:], fraction="0.25", scheduler=UNFENCED_PROFILE)
            def bound() -> list[Any] | None:
                pods = faults.api.list_namespaced_pod(ns).items
                return pods if len(pods) == 24 and all(p.spec.node_name for p in pods) else None
            try:
                pods = list(wait_until(bound, 120, f"24 pods of {ns} bound", interval_s=0.5))
            except Exception as exc:
                raise AssertionError(f"{exc}\n--- gpufrac ---\n{gpufrac.tail(3000)}") from None
        assert failures == []
        assert gpufrac.popen.poll() is None  # recovered without a restart
        assert check_invariants(faults.api) == []
        recorded = {p.metadata.name: p.metadata.annotations["gpufrac.io/assigned-gpus"].split(",") for p in pods}
        wait_until(lambda: {a["name"]: a["gpu_uuids"] for a in httpx.get(
            f"http://{LOOPBACK}:{port}/allocations", timeout=10).json() if a["namespace"] == ns} == recorded,
            30, "the unfenced gpufrac's allocations equal to the API's records")
    finally:
        scheduler.stop()
        gpufrac.stop()


def test_etcd_stopped_for_30s_binds_are_refused_cleanly_then_recover(faults: Faults) -> None:
    group = "etcd"
    nodes = make_nodes(faults.api, group, 2, gpus=2)
    ns = new_namespace(faults.api, "etcd")
    # Pods nobody schedules: the test calls /bind itself, as kube-scheduler would.
    create_pods(faults.api, ns, group, ["a", "b"], fraction="0.5", scheduler="none")
    uids = {p.metadata.name: p.metadata.uid for p in faults.api.list_namespaced_pod(ns).items}
    wait_until(lambda: httpx.get(f"{faults.url}/readyz", timeout=5).status_code == 200, 30, "gpufrac ready")

    def bind(name: str) -> httpx.Response:
        return httpx.post(f"{faults.url}/bind", timeout=60, json={
            "PodName": name, "PodNamespace": ns, "PodUID": uids[name], "Node": nodes[0]})

    with health_probe(faults.url) as failures:
        etcd = faults.cp.proc("etcd")
        etcd.stop()
        started = time.monotonic()
        refused = bind("a")
        assert refused.status_code == 200
        assert refused.json()["Error"].startswith("gpufrac: "), refused.json()
        assert "a" not in faults.allocations(ns)  # the refused bind holds nothing
        time.sleep(max(0.0, 30 - (time.monotonic() - started)))
        faults.cp.restart("etcd")  # same data directory: the cluster as it was
        wait_until(lambda: bind("a").json()["Error"] == "", 90, "a bind after etcd is back")
    assert failures == []
    assert faults.gpufrac.popen.poll() is None
    pods = [p for p in faults.api.list_namespaced_pod(ns).items if p.spec.node_name]
    assert [p.metadata.name for p in pods] == ["a"]
    faults.consistent(ns, pods)


def test_a_slow_api_server_still_binds_every_pod(faults: Faults) -> None:
    group = "slow"
    make_nodes(faults.api, group, 3, gpus=2)
    ns = new_namespace(faults.api, "slow")
    with gpufrac_through(faults, 0.15, "slow"):
        with health_probe(faults.url) as failures:
            create_pods(faults.api, ns, group, [f"s{i}" for i in range(8)], fraction="0.5")
            pods = faults.bound(ns, 8, 120)
        assert failures == []
        faults.consistent(ns, pods)


def test_a_replica_killed_between_its_claim_and_the_binding_holds_nothing_after_the_ttl(faults: Faults) -> None:
    group = "killed"
    (node,) = make_nodes(faults.api, group, 1, gpus=1)
    ns = new_namespace(faults.api, "killed")
    create_pods(faults.api, ns, group, ["orphan"], gpus=1, scheduler="none")
    orphan = faults.api.read_namespaced_pod("orphan", ns)
    inventory = faults.api.read_node(node).metadata.annotations["gpufrac.io/inventory"]
    uuid = yaml.safe_load(inventory)["gpus"][0]["uuid"]
    # What a replica leaves when it dies after its claim and before its Binding: the claim
    # (whole GPU) in the node's ledger, the pod unbound. Written by the fence's own code.
    dead = ClaimFence(kube_api(faults.cp.admin_kubeconfig), FENCE_NS, "killed-replica", ttl_s=CLAIM_TTL_S)
    dead.commit(dead.view(node), dead.claim_of(orphan.metadata.uid, ns, "orphan", node, [uuid], 1000, [24576]))
    seen = time.monotonic()
    create_pods(faults.api, ns, group, ["next"], gpus=1)

    def next_bound() -> bool:
        return bool(faults.api.read_namespaced_pod("next", ns).spec.node_name)

    # While the claim lives the GPU is taken; after the TTL it is free again.
    time.sleep(max(0.0, CLAIM_TTL_S / 2 - (time.monotonic() - seen)))
    assert not next_bound()
    wait_until(next_bound, 60, "the next pod bound once the dead replica's claim expired")
    assert time.monotonic() - seen >= CLAIM_TTL_S * 0.9
    assert "orphan" not in faults.allocations(ns)
    pods = [p for p in faults.api.list_namespaced_pod(ns).items if p.spec.node_name]
    faults.consistent(ns, pods)


def test_black_holed_connections_a_new_node_and_a_freed_share_are_seen_within_60s(faults: Faults) -> None:
    """gpufrac's API connections black-holed (no FIN, no RST; new connections pass, as after a
    NAT dropped the flows) while a node is added and a bound pod deleted: each watch gives up
    its silent connection at its read deadline (watch timeout 30 s + 15 s) and resumes on a new
    one; meanwhile /readyz and gpufrac_watch_silence_seconds show the silence growing."""
    group = "hole"
    make_nodes(faults.api, group, 1, gpus=2)
    ns = new_namespace(faults.api, "hole")
    with gpufrac_through(faults, 0.0, "hole") as proxy:
        try:
            create_pods(faults.api, ns, group, ["h0"], gpus=2)
            faults.bound(ns, 1, 60)
            wait_until(lambda: "h0" in faults.allocations(ns), 30, "h0 in gpufrac's cache")
            time.sleep(2)  # every watch is on its connection
            holed = proxy.black_hole()
            started = time.monotonic()
            assert holed >= 3  # the node, pod and namespace watches at least
            (added,) = make_nodes(faults.api, f"{group}-new", 1, gpus=1)
            faults.api.delete_namespaced_pod("h0", ns, grace_period_seconds=0)
            silences: list[float] = []

            def seen() -> bool:
                detail = httpx.get(f"{faults.url}/readyz", timeout=10).json()
                silences.append(max(detail["watch_silence_s"].values()))
                metric = httpx.get(f"{faults.url}/metrics", timeout=10).text
                assert 'gpufrac_watch_silence_seconds{watch="node"}' in metric
                probe = {"metadata": {"name": "probe", "namespace": "default", "uid": "probe"},
                         "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpufrac.io/gpu": "1"}}}]}}
                reply = httpx.post(f"{faults.url}/filter", json={"Pod": probe, "Nodes": None, "NodeNames": [added]},
                                   timeout=10).json()
                known = "not in gpufrac's cache" not in str(reply.get("FailedNodes", {}).get(added, ""))
                return known and "h0" not in faults.allocations(ns)
            wait_until(seen, 60, "the new node known and h0's share freed", interval_s=1)
            took = time.monotonic() - started
            print(f"\nblack hole: node known and share freed after {took:.1f} s; longest silence seen "
                  f"{max(silences):.1f} s")
            assert took <= 60
            assert max(silences) >= 20  # the silence grew visibly before the watches gave up
        except Exception:
            raise AssertionError(f"--- gpufrac ---\n{faults.gpufrac.tail(4000)}") from None
