"""Fast JSON responses (orjson), in kube-scheduler's Go field spelling."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response


def json_response(body: Any, status_code: int = 200) -> Response:
    """Serialize with orjson; pydantic models are dumped in their Go field spelling."""
    if hasattr(body, "model_dump"):
        body = body.model_dump()
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")
