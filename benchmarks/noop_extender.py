"""A no-op scheduler extender: the baseline cost of the extender protocol itself.

``filter`` passes every candidate, ``prioritize`` scores them all 0; no ``bind`` verb, so
kube-scheduler binds by itself. Same stack as gpufrac (FastAPI, uvicorn, orjson), so the
difference between this and gpufrac in ``bench_scheduler`` is gpufrac's own work.

Run: ``python -m benchmarks.noop_extender PORT``
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request, Response

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


@app.get("/healthz")
async def healthz() -> Response:
    """Up."""
    return _json({"status": "ok"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
