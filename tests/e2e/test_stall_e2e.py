"""A stranger holding the scheduler's Lease, on the real control plane (issue 52, item 2).

A kube-scheduler with leader election on deploy's Lease (``gpufrac-system/gpufrac-scheduler``)
and its own profile, and a gpufrac reading that Lease. A stranger's Lease (holder
``stranger-controller``, ``leaseDurationSeconds`` 10^9) before start and again while the
scheduler leads: each time the waiting GPU pods are reported with the holder named in
``/readyz``, the metrics, the log and an Event on each pod; after the recovery step of
docs/troubleshooting.md (run as the doc writes it) every pod binds, nothing over-committed.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import docs
from harness.processes import LOOPBACK, Proc, free_port, wait_until
from tests.e2e.conftest import Cluster, unique
from tests.e2e.helpers import check_invariants, gpu_pod, make_nodes, new_namespace

pytestmark = pytest.mark.e2e

PROFILE = "gpufrac-stall"
LEASE_NS, LEASE = "gpufrac-system", "gpufrac-scheduler"
STRANGER = "stranger-controller"
LEASE_S = 4.0
TROUBLESHOOTING = "docs/troubleshooting.md"


def stranger_takes_the_lease(leases: client.CoordinationV1Api) -> None:
    """Write the Lease as a stranger would: holder, renewTime now, a duration of 10^9 s.

    A leading kube-scheduler renews the Lease every retry period (1 s here), so a read and
    the replace after it can race its renewal: the API server answers 409 Conflict and the
    stranger, as any controller would, reads again and retries (at most 20 times).
    """
    for _ in range(20):
        now = dt.datetime.now(dt.UTC)
        spec = client.V1LeaseSpec(holder_identity=STRANGER, lease_duration_seconds=10**9, acquire_time=now,
                                  renew_time=now)
        try:
            current = leases.read_namespaced_lease(LEASE, LEASE_NS)
        except ApiException as exc:
            assert exc.status == 404
            leases.create_namespaced_lease(LEASE_NS, client.V1Lease(metadata=client.V1ObjectMeta(name=LEASE),
                                                                    spec=spec))
            return
        current.spec = spec
        try:
            leases.replace_namespaced_lease(LEASE, LEASE_NS, current)
            return
        except ApiException as exc:
            assert exc.status == 409, exc
    raise AssertionError("the stranger's write lost 20 races with the scheduler's renewals")


def scheduler_detail(url: str) -> dict[str, Any]:
    detail: dict[str, Any] = httpx.get(f"{url}/readyz", timeout=10).json()["scheduler"]
    return detail


def reported(cl: Cluster, url: str, gpufrac: Proc, ns: str, names: list[str]) -> None:
    """Within 60 s: the pods in /readyz with the stranger named, the metrics, the log, an Event each."""
    def named() -> dict[str, Any] | None:
        d = scheduler_detail(url)
        return d if d["pods_not_attempted"] >= len(names) and STRANGER in d["cause"] else None
    detail = cl.wait(named, 60, "the stall reported with the stranger named in /readyz")
    assert detail["lease"]["holder"] == STRANGER and detail["lease"]["holder_in_release"] is False
    assert detail["lease"]["lease_duration_s"] == 10**9
    assert "not a kube-scheduler pod of this release" in detail["cause"]
    text = httpx.get(f"{url}/metrics", timeout=10).text
    assert f"gpufrac_pods_not_attempted {float(len(names))}" in text
    assert (f'gpufrac_scheduler_lease_renew_age_seconds{{holder="{STRANGER}",holder_in_release="false",'
            f'lease="{LEASE_NS}/{LEASE}"}}') in text
    log = gpufrac.log.read_text(errors="replace")
    assert "not attempted by any scheduler" in log and STRANGER in log

    def events() -> set[str] | None:
        got = {e.involved_object.name for e in cl.api.list_namespaced_event(ns).items
               if e.reason == "SchedulingNotAttempted" and STRANGER in (e.message or "")}
        return got if got >= set(names) else None
    cl.wait(events, 30, "a SchedulingNotAttempted event on every waiting pod")


def recover_and_bind(cl: Cluster, ns: str, names: list[str]) -> None:
    """The doc's steps: who holds the Lease, then delete it; every pod then binds."""
    tools = [cl.cp.bins["kubectl"]]
    holder = docs.run(docs.command(TROUBLESHOOTING, "kubectl -n gpufrac-system get lease gpufrac-scheduler"),
                      cl.cp.admin_kubeconfig, tools).stdout.strip()
    assert holder == STRANGER
    docs.run(docs.command(TROUBLESHOOTING, "kubectl -n gpufrac-system delete lease gpufrac-scheduler"),
             cl.cp.admin_kubeconfig, tools)

    def bound() -> bool:
        pods = {p.metadata.name: p for p in cl.api.list_namespaced_pod(ns).items}
        return all(pods[n].spec.node_name for n in names)
    cl.wait(bound, 60, f"{len(names)} pods bound after the Lease was deleted")


def test_a_strangers_lease_is_named_and_the_documented_recovery_binds_every_pod(cluster: Cluster) -> None:
    cl = cluster
    leases = client.CoordinationV1Api(cl.api.api_client)
    group, ns = unique("stall"), new_namespace(cl.api, unique("stall"))
    make_nodes(cl.api, group, 2, gpus=2, replicas=4)
    try:
        cl.api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=LEASE_NS)))
    except ApiException as exc:
        assert exc.status == 409
    stranger_takes_the_lease(leases)  # before anything starts
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    gpufrac = cl.cp.start_gpufrac(port, name="gpufrac-stall", extra=[
        "--inventory-stale-after-s", "600", "--scheduler-name", PROFILE, "--stall-after-s", "5",
        "--scheduler-lease", f"{LEASE_NS}/{LEASE}",
        "--scheduler-pod-selector", "app.kubernetes.io/component=scheduler,gpufrac.io/test=stall"])
    scheds: list[Proc] = []

    def start_scheduler() -> Proc:
        s = cl.cp.start_scheduler(url, name=f"kube-scheduler-stall-{len(scheds)}", profile=PROFILE,
                                  leader_lease_s=LEASE_S, lease=(LEASE_NS, LEASE))
        scheds.append(s)
        return s

    try:
        first = start_scheduler()
        names = [f"a{i}" for i in range(4)]
        for n in names:
            cl.api.create_namespaced_pod(ns, gpu_pod(n, group, fraction="0.25", scheduler=PROFILE))
        reported(cl, url, gpufrac, ns, names)
        recover_and_bind(cl, ns, names)
        cl.wait(lambda: scheduler_detail(url)["pods_not_attempted"] == 0, 30, "the stall report cleared")
        assert "attempted again" in gpufrac.log.read_text(errors="replace")

        # During leadership: the stranger overwrites the Lease; the leader cannot renew it and
        # exits (kube-scheduler's "leaderelection lost"); restarted, as kubelet restarts it, it waits.
        wait_until(lambda: "successfully acquired lease" in first.log.read_text(errors="replace").lower(), 30,
                   "the scheduler leading")
        stranger_takes_the_lease(leases)
        wait_until(lambda: first.popen.poll() is not None, 60, "the deposed leader exiting")
        start_scheduler()
        more = [f"b{i}" for i in range(4)]
        for n in more:
            cl.api.create_namespaced_pod(ns, gpu_pod(n, group, fraction="0.25", scheduler=PROFILE))
        reported(cl, url, gpufrac, ns, more)
        recover_and_bind(cl, ns, names + more)
    except Exception as exc:
        logs = "\n".join(f"--- {s.name} ---\n{s.tail(2000)}" for s in scheds)
        raise AssertionError(f"{exc!r}\n--- gpufrac ---\n{gpufrac.tail(3000)}\n{logs}") from exc
    finally:
        for s in scheds:
            s.stop()
        gpufrac.stop()
        try:
            leases.delete_namespaced_lease(LEASE, LEASE_NS)
        except ApiException:
            pass
    assert check_invariants(cl.api) == []
