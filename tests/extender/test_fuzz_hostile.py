"""Hostile-input fuzzing of every verb and the pod-events endpoint (issue 22).

Where ``test_fuzz_http`` varies mostly valid pods, this suite generates what a hostile or
careless user writes: extreme quantities (huge, tiny, negative, exponents, non-ASCII
digits, JSON numbers and booleans where strings belong), wrong JSON types at every level,
duplicate and unknown node names, and forged ``gpufrac.io/assigned-*`` annotations. For
every request: no 5xx. Across the whole run: the extender's peak RSS grows by less than
200 MB, the allocations stay feasible, and afterwards a normal pod is filtered, prioritized
and bound as usual. The extender runs as ``gpufrac serve`` in a process of its own, fuzzed
over real HTTP, so the memory measured is the server's alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podspec import annotations as ann
from tests.conftest import gpu_node, pod_json
from tests.extender.helpers import EVENTS_TOKEN, infeasible

NODES = [gpu_node("a", 2, replicas=4), gpu_node("b", 1, model="A10", memory_mib=24576, replicas=4)]
NAMES = ["a", "b", "missing"]
EXAMPLES = int(os.environ.get("GPUFRAC_FUZZ_EXAMPLES", "150"))
"""Examples per verb (CI: 150; set GPUFRAC_FUZZ_EXAMPLES for a longer run)."""
RSS_GROWTH_LIMIT_MB = 200

digits = st.sampled_from(["0", "1", "7", "9", "٣", "５", "߁", "१"])  # ASCII and non-ASCII digits
extreme_numbers = st.one_of(
    st.integers(-(2**80), 2**80), st.sampled_from([2**53, 2**63, 2**64, 2**70, -(2**63) - 1, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans())
quantity_text = st.one_of(
    st.sampled_from(["1000Mi", "1e-1000030", "1e999999", "1e400", "-1", "-0", "0.0001", "1e-3", "9Ei",
                     "8Pi", "NaN", "inf", "Infinity", "+1", ".5", "5.", "1_000", "0x10", " 1 ", "1 Gi",
                     "١٢", "٠.٥", "1e+308", str(2**70), str(2**53), "1" * 400, ""]),
    st.builds(lambda a, b, suf: f"{a}{b}{suf}", digits, st.text("0123456789.eE+-", max_size=6),
              st.sampled_from(["", "m", "k", "Ki", "Mi", "Gi", "Ei", "e9", "e-9", "x"])))
quantities = st.one_of(quantity_text, extreme_numbers, st.lists(quantity_text, max_size=2),
                       st.dictionaries(st.text(max_size=3), quantity_text, max_size=2), st.none())
scalars = st.one_of(st.none(), st.booleans(), extreme_numbers, st.text(max_size=12))
any_json = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)
annotation_values = st.one_of(quantity_text, any_json, st.sampled_from(
    ["guaranteed", "best-effort", "T4|A10", "|" * 70, "x" * 300, "GPU-a-0,GPU-a-0,GPU-a-0",
     "GPU-a-0,GPU-a-1", "GPU-b-0", "0.1,0.2", "16384Mi,16384Mi", "1e400Mi"]))


FIELDS = ("gpu", "cpu", "memory", ann.FRACTION, ann.MEMORY, ann.GPU_MODEL, ann.QOS, "forged", "priority",
          "shape")


def _valid_pod(draw: st.DrawFn) -> dict[str, Any]:
    annotations = draw(st.dictionaries(st.sampled_from([ann.FRACTION, ann.QOS]), st.sampled_from(
        ["0.5", "0.25", "1"]), max_size=1))
    if ann.QOS in annotations:
        annotations[ann.QOS] = draw(st.sampled_from(["guaranteed", "burstable", "best-effort"]))
    return pod_json(draw(st.sampled_from(["p1", "p2", "p3"])), gpus=draw(st.integers(0, 2)) or None,
                    annotations=annotations, cpu="100m", memory="64Mi",
                    node=draw(st.one_of(st.none(), st.sampled_from(NAMES))),
                    phase=draw(st.sampled_from(["Pending", "Running", "Failed"])))


@st.composite
def hostile_pods(draw: st.DrawFn) -> Any:
    """Mostly a valid Pod with exactly one hostile field (so that field is what gets
    parsed, not an earlier error); else a pod wrong everywhere, or not a Pod at all."""
    mode = draw(st.integers(0, 9))
    if mode == 0:
        return draw(any_json)
    pod = _valid_pod(draw)
    resources = pod["spec"]["containers"][0]["resources"]
    fields = [draw(st.sampled_from(FIELDS))] if mode <= 6 else draw(st.lists(st.sampled_from(FIELDS), max_size=5))
    for field in sorted(fields, key=lambda f: f == "shape"):  # the wrong type last: it may replace a parent
        if field == "gpu":
            resources.setdefault("limits", {})[ann.RESOURCE_GPU] = draw(quantities)
        elif field in ("cpu", "memory"):
            resources["requests"][field] = draw(quantities)
        elif field == "forged":  # an allocation record the pod wrote itself
            pod["spec"]["nodeName"] = draw(st.sampled_from(["a", "b"]))
            pod["status"]["phase"] = "Running"
            pod["metadata"]["annotations"].update(draw(st.fixed_dictionaries({
                ann.ASSIGNED_GPUS: st.sampled_from(["GPU-a-0", "GPU-a-1", "GPU-a-0,GPU-a-1", "GPU-a-0,GPU-a-0",
                                                    "GPU-b-0", "GPU-x-9", ""]),
                ann.ASSIGNED_FRACTION: st.one_of(st.sampled_from(["1", "0.5", "0.001", "5"]), annotation_values),
                ann.ASSIGNED_MEMORY: st.one_of(st.sampled_from(["16384Mi", "160Gi", "1Mi,1Mi", "0"]),
                                               annotation_values)})))
            pod["metadata"]["annotations"][ann.QOS] = draw(st.sampled_from(["guaranteed", "best-effort"]))
        elif field == "priority":
            pod["spec"]["priority"] = draw(extreme_numbers)
        elif field == "shape":  # a wrong type somewhere
            path = draw(st.sampled_from([("metadata",), ("spec",), ("status",), ("metadata", "name"),
                                         ("metadata", "uid"), ("metadata", "namespace"),
                                         ("metadata", "annotations"), ("spec", "containers"),
                                         ("spec", "nodeName"), ("spec", "schedulerName"),
                                         ("spec", "initContainers")]))
            target: Any = pod
            for key in path[:-1]:
                target = target.get(key) if isinstance(target, dict) else None
            if isinstance(target, dict):  # an earlier wrong type may have replaced the parent
                target[path[-1]] = draw(any_json)
        else:
            pod["metadata"]["annotations"][field] = draw(annotation_values)
    if draw(st.integers(0, 9)) == 0 and isinstance(pod["spec"], dict) and isinstance(
            pod["spec"].get("containers"), list):  # many containers
        pod["spec"]["containers"] = pod["spec"]["containers"] * draw(st.integers(0, 40))
    return pod


def names() -> st.SearchStrategy[Any]:
    good = st.lists(st.sampled_from(NAMES + ["a", "a", "b" * 300]), max_size=6)
    return st.one_of(good, any_json)


def bodies(verb: str) -> st.SearchStrategy[Any]:
    if verb in ("filter", "prioritize"):
        nodes = st.one_of(st.none(), st.fixed_dictionaries({"items": st.lists(st.one_of(
            st.fixed_dictionaries({"metadata": st.one_of(st.fixed_dictionaries(
                {"name": st.one_of(st.sampled_from(NAMES), any_json)}), any_json)}), any_json), max_size=4)}))
        good: st.SearchStrategy[Any] = st.fixed_dictionaries({"Pod": hostile_pods(), "NodeNames": names()},
                                                             optional={"Nodes": nodes})
    elif verb == "bind":
        field = st.one_of(st.sampled_from(["p1", "p2", "default", "a", "b", "uid-p1", ""]), any_json)
        good = st.fixed_dictionaries({"PodName": field, "PodNamespace": field, "PodUID": field, "Node": field})
    elif verb == "preempt":
        victims = st.dictionaries(st.one_of(st.sampled_from(NAMES), st.text(max_size=4)), st.fixed_dictionaries(
            {"Pods": st.one_of(st.lists(st.fixed_dictionaries({"UID": st.one_of(st.text(max_size=6), any_json)}),
                                        max_size=3), any_json),
             "NumPDBViolations": extreme_numbers}), max_size=4)
        good = st.fixed_dictionaries({"Pod": hostile_pods()},
                                     optional={"NodeNameToMetaVictims": victims, "NodeNameToVictims": any_json})
    else:
        good = st.lists(st.fixed_dictionaries({"type": st.one_of(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
                                                                 any_json),
                                               "object": hostile_pods()}), max_size=4)
    return st.one_of(good, any_json)


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


@contextmanager
def extender_process(tmp_path: Path) -> Iterator[tuple[httpx.Client, int]]:
    """``gpufrac serve`` (standalone) in its own process on a free loopback port, with an
    events token: the process measured is the one being fuzzed, fresh, over real HTTP."""
    nodes = {"nodes": [{"name": n.name, "cpu_milli": n.cpu_milli, "memory_mib": n.memory_mib,
                        "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model,
                                  "memory_mib": g.memory_mib, "replicas": g.replicas} for g in n.gpus]}
                       for n in NODES]}
    cluster = tmp_path / "nodes.yaml"
    cluster.write_text(yaml.safe_dump(nodes))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "extender", "serve", "--cluster-file", str(cluster),
                             "--port", str(port)], env={**os.environ, "GPUFRAC_EVENTS_TOKEN": EVENTS_TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                        headers={"Authorization": f"Bearer {EVENTS_TOKEN}"})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "extender did not start"
            try:
                if http.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield http, proc.pid
    finally:
        http.close()
        proc.terminate()
        proc.wait(10)


def test_hostile_requests_on_every_verb_never_5xx_bounded_memory_then_normal_service(tmp_path: Path) -> None:
    tried: dict[str, int] = defaultdict(int)
    with extender_process(tmp_path) as (http, pid):
        start_peak = peak_rss_mb(pid)

        def fuzz(verb: str) -> None:
            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
            @given(body=bodies(verb))
            def run(body: Any) -> None:
                # NaN and infinities go out as the (invalid) JSON tokens NaN/Infinity: a 400 too.
                r = http.post(f"/{verb}", content=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})
                tried[verb] += 1
                assert r.status_code < 500, (verb, body, r.status_code, r.text)
                assert infeasible(http.get("/allocations").json(), NODES) == [], (verb, body)

            run()

        for verb in ("filter", "prioritize", "preempt", "bind", "standalone/pod-events"):
            fuzz(verb)
        growth = peak_rss_mb(pid) - start_peak
        assert growth < RSS_GROWTH_LIMIT_MB, f"peak RSS grew {growth:.0f} MB"
        # After all that, with the fuzzed pods deleted, a normal pod is served as usual.
        gone = [{"type": "DELETED", "object": pod_json(n)} for n in ("p1", "p2", "p3")]
        assert http.post("/standalone/pod-events", json=gone).status_code == 200
        assert http.get("/readyz").json()["gpu_allocated_milli"] == 0, http.get("/allocations").json()
        pod = pod_json("normal", annotations={ann.FRACTION: "0.5"}, cpu="100m", memory="64Mi")
        assert http.post("/standalone/pod-events", json=[{"type": "ADDED", "object": pod}]).status_code == 200
        f = http.post("/filter", json={"Pod": pod, "NodeNames": ["a", "b"]}).json()
        assert f["Error"] == "" and f["NodeNames"], f
        scores = http.post("/prioritize", json={"Pod": pod, "NodeNames": f["NodeNames"]}).json()
        host = max(scores, key=lambda h: h["Score"])["Host"]
        b = http.post("/bind", json={"PodName": "normal", "PodNamespace": "default", "PodUID": "uid-normal",
                                     "Node": host}).json()
        assert b == {"Error": ""}, b
    assert sum(tried.values()) >= 5 * EXAMPLES
    print(f"hostile fuzz: {dict(tried)} requests, peak RSS of the extender {start_peak:.0f} -> "
          f"{start_peak + growth:.0f} MB (growth {growth:.1f} MB)")
