"""Request and response bodies of the HTTP routes.

- ``json_body``: request bodies parsed straight from bytes by pydantic-core's JSON parser.
  FastAPI's default path is ``json.loads`` then model validation; for a 5,000-node
  ``ExtenderArgs`` (85 KB) parsing from bytes in one step halves that cost. The dependency
  is async (it awaits the body) while the handlers stay sync, so numpy still runs in the
  threadpool. Errors surface as ``RequestValidationError`` and get the usual 400 reply.
- ``json_response``: replies serialized by orjson, in kube-scheduler's Go field spelling.
- ``BodyLimitMiddleware``: request bodies over a size limit get 413 before they are read
  whole. Starlette has no body limit of its own. A declared ``Content-Length`` over the
  limit is refused at once; a chunked body is counted as it streams and refused when it
  passes the limit (an ``HTTPException`` raised where the route reads the body, which
  FastAPI's exception middleware turns into the 413), so a client cannot make the extender
  buffer an unbounded body. Add it with ``app.add_middleware(BodyLimitMiddleware, max_bytes=...)``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import orjson
from fastapi import Request, Response
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

Scope = dict[str, Any]
Message = dict[str, Any]

INLINE_PARSE_BYTES = 256 * 1024
"""Bodies up to this size are validated on the event loop (a few hundred microseconds)."""


class BadRequest(Exception):
    """A request body that does not parse or validate; the message names every field (at
    most ten), as the 400 reply's ``Error``."""


def validation_message(errors: Sequence[Any]) -> str:
    """``invalid request: <field>: <why>; ...`` from pydantic's errors (the first ten)."""
    parts = []
    for err in errors[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def json_body(model: Any) -> tuple[Callable[[bytes], Awaitable[Any]], dict[str, Any]]:
    """A parser of a raw body as ``model``, and the ``openapi_extra`` describing it.

    Parameters
    ----------
    model : type
        A pydantic model or any type ``TypeAdapter`` accepts (``list[PodEvent]``).

    Returns
    -------
    parse : async callable (bytes) -> model
        Raises ``BadRequest``.
    openapi_extra : dict
    """
    adapter = TypeAdapter(model)

    async def parse(body: bytes) -> Any:
        try:
            if len(body) <= INLINE_PARSE_BYTES:
                return adapter.validate_json(body)
            # A large body (full Node objects) takes tens of milliseconds to validate: off
            # the event loop, like the handlers.
            return await anyio.to_thread.run_sync(adapter.validate_json, body)
        except ValidationError as exc:
            raise BadRequest(validation_message(exc.errors(include_url=False))) from None

    name = model.__name__ if isinstance(model, type) and issubclass(model, BaseModel) else "Body"
    extra = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": _inline_refs(adapter.json_schema())}}}, "x-body-model": name}
    return parse, extra


def json_dependency(parse: Callable[[bytes], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
    """``parse`` as a FastAPI dependency; a ``BadRequest`` becomes the usual 400 reply."""

    async def dependency(request: Request) -> Any:
        try:
            return await parse(await request.body())
        except BadRequest as exc:
            raise HTTPException(400, str(exc)) from None

    return dependency


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace ``#/$defs/X`` references by the definitions (the wire models are not
    recursive), so the schema stands alone inside the OpenAPI document."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)
    return inlined


def encode_json(body: Any) -> bytes:
    """A plain JSON body (dicts, lists, strings, numbers) as bytes, with orjson.

    A body echoing what a request sent (``filter`` returns the node items it was given)
    may hold an integer beyond 64 bits, which orjson cannot write: then the standard
    library writes it, exactly as received.
    """
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


def json_response(body: Any, status_code: int = 200) -> Response:
    """``encode_json(body)`` as a response."""
    return Response(encode_json(body), status_code=status_code, media_type="application/json")


def too_large_message(max_bytes: int) -> str:
    """The ``Error`` of a 413 reply."""
    return f"request body over {max_bytes} bytes"


def declared_over(scope: Mapping[str, Any], max_bytes: int) -> bool:
    """True when the request's ``Content-Length`` declares more than ``max_bytes``."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value) > max_bytes
            except ValueError:
                return False
    return False


class BodyLimitMiddleware:
    """Wrap an ASGI app; HTTP requests with a body over ``max_bytes`` get 413.

    Parameters
    ----------
    app : ASGI application
    max_bytes : int
        Largest accepted body, bytes.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reply_413(self, send: Any) -> None:
        body = orjson.dumps({"Error": too_large_message(self.max_bytes)})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if declared_over(scope, self.max_bytes):
            await self._reply_413(send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message: Message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, too_large_message(self.max_bytes))
            return message

        await self.app(scope, counting_receive, send)
