"""A real control plane for the end-to-end tests (session scope, built once, stopped by PID).

etcd, kube-apiserver and kube-scheduler are the real binaries (``harness.controlplane``
builds them from Go modules on first use); gpufrac runs in cluster mode as a subprocess,
exactly as ``gpufrac serve --mode cluster`` would. Nothing here is skipped: a machine that
cannot build or start them fails these tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import pytest
from kubernetes import client, config

from harness.controlplane import ControlPlane
from harness.processes import LOOPBACK, Proc, free_port, wait_until

T = TypeVar("T")

STALE_AFTER_S = 600
"""Fake nodes publish their inventory once; this keeps them fresh for the whole session."""


@dataclass
class Cluster:
    """The running control plane, gpufrac and kube-scheduler, and helpers over them."""

    cp: ControlPlane
    api: client.CoreV1Api
    gpufrac_port: int
    gpufrac: Proc
    scheduler: Proc

    @property
    def url(self) -> str:
        """gpufrac's base URL."""
        return f"http://{LOOPBACK}:{self.gpufrac_port}"

    def start_gpufrac(self, extra: list[str] | None = None) -> Proc:
        """(Re)start gpufrac on the same port (``extra``: more ``serve`` flags) and wait until it
        has synced."""
        self.gpufrac = self.cp.start_gpufrac(
            self.gpufrac_port, extra=["--inventory-stale-after-s", str(STALE_AFTER_S), *(extra or [])])
        return self.gpufrac

    def allocations(self) -> list[dict[str, Any]]:
        """gpufrac's ``/allocations``, sorted by pod UID."""
        return sorted(httpx.get(f"{self.url}/allocations", timeout=10).json(), key=lambda a: a["uid"])

    def wait(self, check: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """Poll ``check`` with the gpufrac and scheduler logs in the failure message; its first
        truthy answer."""
        try:
            return cast(T, wait_until(check, timeout_s, what, interval_s=0.3))
        except Exception as exc:
            raise AssertionError(f"{exc}\n--- gpufrac ---\n{self.gpufrac.tail(3000)}\n"
                                 f"--- kube-scheduler ---\n{self.scheduler.tail(3000)}") from None


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver (built from Go modules on first use)."""
    cp = ControlPlane.up(Path(tmp_path_factory.mktemp("kube")))
    yield cp
    cp.down()


@pytest.fixture(scope="session")
def cluster(control_plane: ControlPlane) -> Iterator[Cluster]:
    """gpufrac in cluster mode plus kube-scheduler with the project's scheduler-config.yaml."""
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig)))
    port = free_port()
    gpufrac = control_plane.start_gpufrac(port, extra=["--inventory-stale-after-s", str(STALE_AFTER_S)])
    scheduler = control_plane.start_scheduler(f"http://{LOOPBACK}:{port}")
    yield Cluster(control_plane, api, port, gpufrac, scheduler)


def wait_for_pods(cl: Cluster, namespace: str, names: list[str], timeout_s: float = 60) -> dict[str, Any]:
    """Wait until every named pod is bound (``spec.nodeName``); return them by name."""
    def bound() -> dict[str, Any] | None:
        pods = {p.metadata.name: p for p in cl.api.list_namespaced_pod(namespace).items}
        if all(n in pods and pods[n].spec.node_name for n in names):
            return {n: pods[n] for n in names}
        return None
    return cl.wait(bound, timeout_s, f"pods {names[:5]}... bound")


def bind_directly(cl: Cluster, port: int, namespace: str, name: str, uid: str, node: str,
                  timeout_s: float = 30) -> None:
    """Call ``/bind`` of the gpufrac on ``port`` as kube-scheduler would, until it succeeds
    (a freshly started instance answers "node not in gpufrac's cache" until its watch has
    delivered the node)."""
    body = {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node}

    def bind() -> bool:
        reply = httpx.post(f"http://{LOOPBACK}:{port}/bind", json=body, timeout=30).json()
        return bool(reply.get("Error", "") == "")
    cl.wait(bind, timeout_s, f"bind of {namespace}/{name} through gpufrac on port {port}")


def failed_scheduling_message(cl: Cluster, namespace: str, name: str, timeout_s: float = 30) -> str:
    """The message of the pod's latest FailedScheduling event (waits for one)."""
    def event() -> str | None:
        events = cl.api.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name},reason=FailedScheduling").items
        return events[-1].message if events else None
    return cl.wait(event, timeout_s, f"FailedScheduling event of {namespace}/{name}")


def unique(prefix: str) -> str:
    """A name unique in this session (tests share one cluster)."""
    return f"{prefix}-{time.monotonic_ns() % 10**9}"


def wait_node_known(cl: Cluster, node: str, url: str | None = None, timeout_s: float = 30) -> None:
    """Wait until gpufrac's node watch has delivered ``node`` (tests that call /bind directly)."""
    pod = {"metadata": {"name": "probe", "namespace": "default", "uid": "probe"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpufrac.io/gpu": "1"}}}]}}

    def known() -> bool:
        reply = httpx.post(f"{url or cl.url}/filter", json={"Pod": pod, "Nodes": None, "NodeNames": [node]},
                           timeout=10).json()
        return "not in gpufrac's cache" not in str(reply.get("FailedNodes", {}).get(node, ""))
    cl.wait(known, timeout_s, f"gpufrac knows node {node}")


@dataclass(frozen=True)
class Images:
    """The images the chart runs, built from ``deploy/Dockerfile`` with buildah."""

    extender: str
    agent: str
    scheduler: str


@pytest.fixture(scope="session")
def images(control_plane: ControlPlane) -> Images:
    """Both role images (on the stand-in bases) and a kube-scheduler image from the
    harness's binary; built once per session (layers cached by buildah across runs)."""
    from harness import images as img

    return Images(img.role_image("extender"), img.role_image("agent"),
                  img.scheduler_image(control_plane.bins["kube-scheduler"]))
