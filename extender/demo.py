"""``gpufrac demo``: a first look in seconds, with nothing but the base install.

Starts the extender (standalone mode) on a loopback port with three example nodes, sends
it a fixed list of pods the way kube-scheduler does (pod event, ``filter``, ``prioritize``,
highest score, ``bind``, over HTTP), prints where each went or why it could not, and ends
with the table ``gpufrac inspect --url`` prints, read from the running extender's ``/nodes``
and ``/allocations``.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
import urllib.request
from typing import Any

import uvicorn

from extender.admin_config import scoring_config
from extender.app import create_app
from extender.cache import GpuCache
from extender.inspection import render_table, served
from extender.settings import Settings
from podspec import annotations as ann
from scoring.scorer import build_scorer
from scoring.specs import GpuSpec, NodeSpec

NEXT_DOC = "docs/install.md"
"""Where the demo points the reader next (a test checks the file exists)."""

NODES = [
    NodeSpec("node-a10-1", 64000, 262144, tuple(GpuSpec(i, f"GPU-a10-1-{i}", "A10", 24576, 4) for i in range(4))),
    NodeSpec("node-a10-2", 64000, 262144, tuple(GpuSpec(i, f"GPU-a10-2-{i}", "A10", 24576, 4) for i in range(4))),
    NodeSpec("node-a100", 96000, 524288, tuple(GpuSpec(i, f"GPU-a100-{i}", "A100", 81920, 4) for i in range(2))),
]
"""Two nodes of four 24 GiB A10s and one of two 80 GiB A100s; 4 time-slicing replicas each."""

# (name, GPUs, annotations): what the pods ask for, in arrival order. The A100-only LLM
# server comes first: the shape prior (scoring.shape_prior.ShapePrior) knows GPU shapes, not
# models, so notebooks arriving first are packed onto the 2-GPU A100 node (to keep the
# 4-GPU A10 nodes whole) and would leave the LLM server waiting.
PODS: list[tuple[str, int, dict[str, str]]] = [
    ("llm-a100", 1, {ann.FRACTION: "0.5", ann.GPU_MODEL: "A100", ann.MEMORY: "40Gi"}),
    ("notebook-1", 1, {ann.FRACTION: "0.25"}),
    ("notebook-2", 1, {ann.FRACTION: "0.25"}),
    ("inference-1", 1, {ann.FRACTION: "0.5", ann.MEMORY: "8Gi", ann.QOS: "guaranteed"}),
    ("inference-2", 1, {ann.FRACTION: "0.5", ann.MEMORY: "8Gi", ann.QOS: "guaranteed"}),
    ("batch-1", 1, {ann.FRACTION: "0.25", ann.QOS: "best-effort"}),
    ("training-1", 2, {}),
    ("notebook-3", 1, {ann.FRACTION: "0.25"}),
    ("training-2", 2, {}),
    ("too-big", 1, {ann.GPU_MODEL: "A100", ann.MEMORY: "100Gi"}),
]


def _pod(name: str, gpus: int, annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "demo", "uid": f"uid-{name}", "annotations": dict(annotations)},
            "spec": {"schedulerName": "gpufrac-scheduler", "containers": [{
                "name": "main", "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                                              "limits": {ann.RESOURCE_GPU: str(gpus)}}}]},
            "status": {"phase": "Pending"}}


def _post(base: str, path: str, body: Any, token: str) -> Any:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _get(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as r:
        return json.loads(r.read())


def run(print_line: Any = print) -> int:
    """Run the demo; 0 when every pod got the answer this demo expects (all placed but the
    last, which fits no GPU)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_urlsafe(16)
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes(NODES)
    app = create_app(Settings(mode="standalone", host="127.0.0.1", port=port, events_token=token,
                              log_level="warning"), cache=cache)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        print_line("gpufrac demo: the extender did not start")
        return 1
    base = f"http://127.0.0.1:{port}"
    names = [n.name for n in NODES]
    print_line(f"gpufrac extender on {base} (standalone), nodes: "
               + ", ".join(f"{n.name} ({len(n.gpus)}x {n.gpus[0].model})" for n in NODES) + "\n")
    placed = 0
    try:
        for name, gpus, annotations in PODS:
            pod = _pod(name, gpus, annotations)
            _post(base, "/standalone/pod-events", [{"type": "ADDED", "object": pod}], token)
            asks = (f"{gpus} GPU" if gpus > 1 or ann.FRACTION not in annotations else f"{annotations[ann.FRACTION]} GPU")
            asks += "".join(f" {k.split('/')[1]}={v}" for k, v in annotations.items() if k != ann.FRACTION)
            f = _post(base, "/filter", {"Pod": pod, "NodeNames": names}, token)
            if not f["NodeNames"]:
                why = sorted(set(f["FailedNodes"].values()) | set(f.get("FailedAndUnresolvableNodes", {}).values()))
                print_line(f"  {name:<12} asks {asks:<45} -> pending: {'; '.join(why)}")
                continue
            scores = _post(base, "/prioritize", {"Pod": pod, "NodeNames": f["NodeNames"]}, token)
            host = max(scores, key=lambda h: h["Score"])["Host"]  # kube-scheduler: highest score
            b = _post(base, "/bind", {"PodName": name, "PodNamespace": "demo", "PodUID": f"uid-{name}",
                                      "Node": host}, token)
            if b["Error"]:
                print_line(f"  {name:<12} asks {asks:<45} -> bind refused: {b['Error']}")
                continue
            (mine,) = [a for a in _get(base, "/allocations") if a["uid"] == f"uid-{name}"]
            placed += 1
            print_line(f"  {name:<12} asks {asks:<45} -> {host} GPU {','.join(map(str, mine['gpu_indices']))}")
        print_line("\n" + render_table(served(_get(base, "/nodes"), _get(base, "/allocations"))))
    finally:
        server.should_exit = True
        thread.join(10)
    print_line(f"\nNext: {NEXT_DOC} (the Helm chart deploy/helm/gpufrac), `gpufrac inspect --url URL` on a "
               "running gpufrac, and `gpufrac inspect` / `kubectl gpufrac inspect` on a real cluster.")
    return 0 if placed == len(PODS) - 1 else 1
