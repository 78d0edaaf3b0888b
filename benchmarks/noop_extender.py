"""A no-op scheduler extender: the baseline cost of the extender protocol itself.

``filter`` passes every candidate, ``prioritize`` scores them all 0; no ``bind`` verb, so
kube-scheduler binds by itself. Same stack as gpufrac (FastAPI, uvicorn, orjson), so the
difference between this and gpufrac in ``bench_scheduler`` is gpufrac's own work.

With ``--bind KUBECONFIG`` it also answers ``bind``, the way any extender that binds must: one
Binding per pod written as ``extender.cluster.KubeBinder`` writes it (``podspec.kubeio.write_json``, without
the allocation annotations, the choice of GPUs or a pod watch). ``bench_scheduler`` runs it as
"no-op binder": the cost of the bind verb itself, which gpufrac's design (kube-scheduler calls
the extender's bind, the extender writes the Binding with the allocation) cannot avoid.

Run: ``python -m benchmarks noop-extender PORT [--bind KUBECONFIG] [--tls CERT KEY CLIENT_CA]``
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request, Response
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.server import uvicorn_tls
from podspec.kubeio import core_path, kube_api, write_json

app = FastAPI(title="no-op extender")


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


@app.post("/filter")
async def filter_nodes(request: Request) -> Response:
    """Every candidate passes."""
    args = orjson.loads(await request.body())
    return _json({"Nodes": args.get("Nodes"), "NodeNames": args.get("NodeNames"),
                  "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""})


@app.post("/prioritize")
async def prioritize(request: Request) -> Response:
    """Every candidate scores 0."""
    args = orjson.loads(await request.body())
    names = args.get("NodeNames") or [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items", [])]
    return _json([{"Host": n, "Score": 0} for n in names])


def add_bind(api: client.CoreV1Api) -> None:
    """Add ``POST /bind``: one Binding per call (a plain ``def``, run in FastAPI's threads, as
    gpufrac's bind)."""

    @app.post("/bind")
    def bind(body: dict[str, Any]) -> Response:
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": body["PodName"], "namespace": body["PodNamespace"], "uid": body["PodUID"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": body["Node"]}}
        try:
            write_json(api, "POST", core_path("namespaces", body["PodNamespace"], "pods", body["PodName"], "binding"),
                       binding)
        except ApiException as exc:
            return _json({"Error": f"{exc.status} {exc.reason}"})
        return _json({"Error": ""})


@app.get("/healthz")
async def healthz() -> Response:
    """Up."""
    return _json({"status": "ok"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks noop-extender``."""
    p.add_argument("port", type=int)
    p.add_argument("--bind", metavar="KUBECONFIG", help="answer bind too, writing Bindings with this kubeconfig")
    p.add_argument("--tls", nargs=3, metavar=("CERT", "KEY", "CLIENT_CA"), type=Path,
                   help="serve HTTPS with this certificate and key, requiring client certificates this CA "
                        "signed (gpufrac's --tls-cert-file, --tls-key-file, --tls-client-ca-file)")


def run(args: argparse.Namespace) -> int:
    """Serve on ``127.0.0.1:PORT`` until stopped."""
    if args.bind:
        add_bind(kube_api(Path(args.bind)))
    tls = uvicorn_tls(*args.tls) if args.tls else {}  # as gpufrac serves it
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, **tls)
    return 0
