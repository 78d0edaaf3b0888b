"""The extender under test, as the replays talk to it: over HTTP (``ExtenderClient``, a
``gpufrac serve`` started by ``start_extender``) or in this process (``InProcessClient``, the
verbs' own functions without the HTTP and JSON layers), with the same verbs either way."""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import orjson

from extender.admin_config import AdminConfig
from extender.cache import GpuCache, PodRecord
from extender.compiled import kernels
from extender.verbs.bind import ExtenderBindingArgs, bind
from extender.verbs.filter import ExtenderArgs, filter
from extender.verbs.pod_events import PodEvent, pod_events
from extender.verbs.prioritize import prioritize
from harness.processes import free_port
from podspec import annotations as ann
from scoring.specs import NodeSpec

REPO_ROOT = Path(__file__).resolve().parent.parent
_T = TypeVar("_T")


class ExtenderClient:
    """kube-scheduler's side of the extender protocol, over HTTP (keep-alive)."""

    def __init__(self, url: str, timeout_s: float = 30.0, events_token: str | None = None) -> None:
        self.url = url.rstrip("/")
        # The pod-events endpoint takes a bearer token (``--events-token``); the verbs need none.
        headers = {"Authorization": f"Bearer {events_token}"} if events_token else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers)

    def _post(self, verb: str, body: Any) -> Any:
        resp = self.http.post(f"{self.url}/{verb}", content=orjson.dumps(body),
                              headers={"Content-Type": "application/json"})
        if resp.status_code != 200:
            raise RuntimeError(f"{verb}: HTTP {resp.status_code}: {resp.text[:300]}")
        return orjson.loads(resp.content)

    def pod_events(self, events: list[dict[str, Any]]) -> None:
        """Post watch events (``ADDED``/``MODIFIED``/``DELETED``) to the standalone endpoint."""
        self._post("standalone/pod-events", events)

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        """``ExtenderArgs`` -> ``ExtenderFilterResult``."""
        return cast(dict[str, Any], self._post("filter", args))

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        """``ExtenderArgs`` -> ``HostPriorityList``."""
        return cast(list[dict[str, Any]], self._post("prioritize", args))

    def bind(self, pod: dict[str, Any], node: str) -> str:
        """``ExtenderBindingArgs`` -> the ``Error`` string (empty on success)."""
        meta = pod["metadata"]
        res = self._post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                  "PodUID": meta["uid"], "Node": node})
        return str(res.get("Error", ""))

    def get(self, path: str) -> Any:
        """GET a JSON endpoint."""
        resp = self.http.get(f"{self.url}/{path}")
        return orjson.loads(resp.content)

    def close(self) -> None:
        """Close the keep-alive connection."""
        self.http.close()


class InProcessClient:
    """The same verbs as ``ExtenderClient`` on a ``GpuCache`` in this process (``--in-process``).

    Each verb is the function its HTTP route calls (``extender.verbs``), on the request type
    the route parses, minus the HTTP and JSON layers, so placements are identical to the HTTP
    replay's and a seed takes seconds: this is the pure-core replay used to explore weights.
    """

    def __init__(self, specs: list[NodeSpec], policy: AdminConfig, decision: str = "filter") -> None:
        compiled = kernels()  # the extender's own
        scorer = compiled.scorer(policy.scoring)
        self.cache = GpuCache(scorer, policy.tolerance)
        self.cache.set_policy(scorer, policy.tenants, policy.tolerance, policy.starvation, policy.defrag)
        self.cache.set_nodes(specs)
        self.decide = decision == "filter"
        self.last_bound: PodRecord | None = None
        """The record of the last successful ``bind`` (its GPUs): the churn replay reads it."""

    def pod_events(self, events: list[dict[str, Any]]) -> None:
        """Apply watch events in order (as ``/standalone/pod-events``)."""
        reply = pod_events(self.cache, [PodEvent.model_validate(e) for e in events])
        if reply.status != 200:
            raise RuntimeError(f"pod events: {reply.error}")

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        """``ExtenderArgs`` -> ``ExtenderFilterResult``."""
        return cast(dict[str, Any], filter(self.cache, ExtenderArgs.model_validate(args), self.decide).body)

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        """``ExtenderArgs`` -> ``HostPriorityList``."""
        return cast(list[dict[str, Any]], prioritize(self.cache, ExtenderArgs.model_validate(args)).body)

    def bind(self, pod: dict[str, Any], node: str) -> str:
        """``ExtenderBindingArgs`` -> the ``Error`` string (empty on success)."""
        meta = pod["metadata"]
        self.last_bound = None
        return bind(self._bind_recorded, ExtenderBindingArgs(
            PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=node)).error

    def _bind_recorded(self, uid: str, namespace: str, name: str, node: str) -> PodRecord:
        self.last_bound = self.cache.bind(uid, namespace, name, node)
        return self.last_bound

    def get(self, path: str) -> Any:
        """``allocations`` or ``readyz`` (the parts of them the replay reads)."""
        if path == "allocations":
            return self.cache.allocations()
        return self.cache.summary()

    def close(self) -> None:
        """Nothing to release."""


def node_object(spec: NodeSpec) -> dict[str, Any]:
    """The Node JSON a nodeCacheCapable=false extender receives for a cluster-file node."""
    inv = ann.NodeInventory(node=spec.name, heartbeat="2026-01-01T00:00:00Z", gpus=[
        ann.GpuInventory(index=g.index, uuid=g.uuid, model=g.model, memory_mib=g.memory_mib,
                         replicas=g.replicas, healthy=g.healthy) for g in spec.gpus])
    slots = sum(g.replicas for g in spec.gpus)
    alloc = {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_mib}Mi", "pods": "110",
             ann.RESOURCE_GPU: str(slots)}
    return {"metadata": {"name": spec.name, "annotations": {ann.INVENTORY: ann.dump_inventory(inv)}},
            "spec": {}, "status": {"capacity": alloc, "allocatable": alloc}}


READY_TIMEOUT_S = 600.0
"""Longest wait for a started extender's ``/readyz`` (a 5,000-node YAML file loads in ~5 s)."""


def start_extender(nodes: Path, policy: str, replicas: int, config: Path | None = None,
                   ready_timeout_s: float = READY_TIMEOUT_S,
                   decision: str = "filter") -> tuple[subprocess.Popen[bytes], ExtenderClient]:
    """Start ``gpufrac serve`` (standalone) on a free loopback port; poll ``/readyz`` until it
    answers 200, at most ``ready_timeout_s``.

    The pod-events endpoint is opened with a fresh random token (passed in the environment,
    never on the command line); the returned client sends it.

    Raises
    ------
    RuntimeError
        The extender exited, or was not ready within ``ready_timeout_s`` (then it is killed).
    """
    port = free_port()
    token = secrets.token_urlsafe(24)
    cmd = [sys.executable, "-m", "extender", "serve", "--cluster-file", str(nodes),
           "--preset", policy, "--port", str(port), "--replicas-per-gpu", str(replicas),
           "--decision", decision]
    if config is not None:
        cmd += ["--config", str(config)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                                                     "GPUFRAC_EVENTS_TOKEN": token})
    url = f"http://127.0.0.1:{port}"
    wait_ok(proc, f"{url}/readyz", ready_timeout_s, "extender")
    wait_scoring(proc, url, ready_timeout_s)
    return proc, ExtenderClient(url, events_token=token)


def wait_scoring(proc: subprocess.Popen[bytes], url: str, timeout_s: float,
                 verify: ssl.SSLContext | bool = True) -> str:
    """Poll ``/readyz`` until its ``scoring`` is no longer ``numpy, compiling``, at most
    ``timeout_s``: what a benchmark times is then the steady state, not the compile running
    beside it (``bench startup`` times the compile). Returns what scores (``numba <version>``
    or ``numpy``). ``verify``: httpx's, for an ``https`` URL (a context with the CA and a
    client certificate).

    Raises
    ------
    RuntimeError
        ``proc`` exited, or the compile did not end within ``timeout_s`` (then ``proc`` is
        killed).
    """
    def done() -> str | None:
        scoring = str(httpx.get(f"{url}/readyz", timeout=1, verify=verify).json()["scoring"])
        return None if scoring.endswith("compiling") else scoring
    return _poll(proc, done, timeout_s, "extender",
                 f"the extender's scoring kernels were not ready within {timeout_s:g} s")


def wait_ok(proc: subprocess.Popen[bytes], url: str, timeout_s: float, what: str,
            verify: ssl.SSLContext | bool = True) -> None:
    """Poll ``url`` until it answers 200, at most ``timeout_s`` (``verify``: as in
    ``wait_scoring``).

    Raises
    ------
    RuntimeError
        ``proc`` exited, or ``url`` did not answer 200 within ``timeout_s`` (then ``proc``
        is killed).
    """
    _poll(proc, lambda: httpx.get(url, timeout=1, verify=verify).status_code == 200 or None, timeout_s, what,
          f"{what} did not become ready within {timeout_s:g} s")


def _poll(proc: subprocess.Popen[bytes], check: Callable[[], _T | None], timeout_s: float, what: str,
          timed_out: str) -> _T:
    """``check()`` every 0.2 s until it is not None (an HTTP error or an unreadable body counts
    as None), at most ``timeout_s``; RuntimeError when ``proc`` exits, or ``timed_out`` (and
    ``proc`` killed) when the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if (value := check()) is not None:
                return value
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(timed_out)
