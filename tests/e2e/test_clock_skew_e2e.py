"""Clocks that disagree, on the real control plane (issue 52, item 1).

Two fenced replicas, each a real kube-scheduler (leader election on) and a gpufrac run under
libfaketime (Debian's ``faketime``, preloaded): one 10 minutes ahead of the nodes' agents, one 10 minutes
behind (the monotonic clock left alone, as NTP drift or a resumed VM leaves it). The agents'
heartbeats are written every 15 s on the true clock; gpufrac runs with deploy's defaults
(``--inventory-stale-after-s`` 180). 200 quarter-GPU pods, the leading pair killed with
SIGKILL after 70 are bound: every pod bound, no GPU over-committed, no FailedScheduling that
blames staleness, and each replica's skew against the agents visible in its metrics.
"""

from __future__ import annotations

import datetime as dt
import re
import threading

import httpx
import pytest

from harness.builds import drop_libfaketime_segments, libfaketime
from harness.controlplane import fake_node_gpus, inventory_annotation
from harness.processes import LOOPBACK, Proc, free_port, wait_until
from tests.e2e.conftest import Cluster, unique
from tests.e2e.helpers import check_invariants, gpu_pod, make_nodes, new_namespace

pytestmark = pytest.mark.e2e

PROFILE = "gpufrac-skew"
LEASE_S = 4.0
SKEW_S = 600
PODS = 200
GPUS, REPLICAS = 4, 4


def start_pair(cl: Cluster, fence_ns: str, name: str, offset_s: int) -> tuple[Proc, Proc, str]:
    """gpufrac with its wall clock ``offset_s`` off (fenced) and a kube-scheduler calling it."""
    port = free_port()
    gpufrac = cl.cp.start_gpufrac(port, name=f"gpufrac-{name}", extra=[
        "--fence-namespace", fence_ns, "--scheduler-name", PROFILE, "--log-level", "warning"],
        wrapper=["env", f"LD_PRELOAD={libfaketime()}", f"FAKETIME={offset_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC=1"])
    url = f"http://{LOOPBACK}:{port}"
    sched = cl.cp.start_scheduler(url, name=f"kube-scheduler-{name}", qps=200, profile=PROFILE,
                                  leader_lease_s=LEASE_S)
    return gpufrac, sched, url


def node_skews(url: str, nodes: list[str]) -> list[float]:
    """The exported skew of each of ``nodes`` (the session's cluster holds other tests' nodes too)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = dict(re.findall(r'^gpufrac_clock_skew_seconds\{kind="node",name="([^"]+)"\} (\S+)$', text, re.M))
    return [float(found[n]) for n in nodes if n in found]


def test_replicas_ten_minutes_off_either_way_schedule_every_pod_through_a_failover(cluster: Cluster) -> None:
    cl = cluster
    group, ns, fence_ns = unique("skew"), new_namespace(cl.api, unique("skew")), new_namespace(cl.api, unique("fence"))
    nodes = make_nodes(cl.api, group, 13, gpus=GPUS, replicas=REPLICAS)  # 208 places for 200 pods
    stop = threading.Event()

    def agents() -> None:  # the agents' heartbeats, on the true clock
        while not stop.wait(15):
            now = dt.datetime.now(dt.UTC)
            for n in nodes:
                gpus = fake_node_gpus(n, GPUS, "A10", 24576, REPLICAS)
                cl.api.patch_node(n, {"metadata": {"annotations": {
                    "gpufrac.io/inventory": inventory_annotation(n, gpus, now)}}})

    beats = threading.Thread(target=agents, daemon=True)
    beats.start()
    pairs = {"ahead": start_pair(cl, fence_ns, "ahead", SKEW_S), "behind": start_pair(cl, fence_ns, "behind", -SKEW_S)}
    try:
        # Each replica sees the agents' clock 10 minutes away from its own, and says so.
        for name, sign in (("ahead", -1), ("behind", 1)):
            url = pairs[name][2]

            def exported(u: str = url) -> list[float] | None:
                got = node_skews(u, nodes)
                return got if len(got) == len(nodes) else None
            skews = cl.wait(exported, 30, f"{name}: node clock skews exported")
            assert len(skews) == len(nodes) and all(abs(s - sign * SKEW_S) < 30 for s in skews), (name, skews)

        def leading() -> str | None:
            got = [n for n, (_, s, _) in pairs.items()
                   if "successfully acquired lease" in s.log.read_text(errors="replace").lower()]
            return got[0] if len(got) == 1 else None
        first = str(cl.wait(leading, 60, "one kube-scheduler leading"))
        for i in range(PODS):
            cl.api.create_namespaced_pod(ns, gpu_pod(f"p{i:03d}", group, fraction="0.25", scheduler=PROFILE))

        def bound() -> int:
            return sum(1 for p in cl.api.list_namespaced_pod(ns).items if p.spec.node_name)
        cl.wait(lambda: bound() >= 70, 120, "70 pods bound before the failover")
        for proc in pairs[first][:2]:
            proc.kill()  # SIGKILL: no lease handed over, no in-flight bind finished
        wait_until(lambda: bound() == PODS, 180, f"all {PODS} pods bound after the failover", interval_s=1)
    except Exception:
        logs = "\n".join(f"--- {p.name} ---\n{p.tail(2500)}" for pair in pairs.values() for p in pair[:2])
        raise AssertionError(logs) from None
    finally:
        stop.set()
        for gpufrac, sched, _ in pairs.values():
            sched.stop()
            gpufrac.stop()
            drop_libfaketime_segments(gpufrac.popen.pid)  # left behind by the SIGKILL
    assert check_invariants(cl.api) == []
    stale = [e.message for e in cl.api.list_namespaced_event(ns).items
             if e.reason == "FailedScheduling" and "stale" in (e.message or "")]
    assert stale == []
    pods = cl.api.list_namespaced_pod(ns).items
    assert len(pods) == PODS and all((p.metadata.annotations or {}).get("gpufrac.io/assigned-gpus") for p in pods)
