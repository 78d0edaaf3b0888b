"""ASGI middleware refusing request bodies over a size limit (413) before they are read whole.

Starlette has no body limit of its own. A declared ``Content-Length`` over the limit is
refused at once; a chunked body is counted as it streams and refused when it passes the
limit (an ``HTTPException`` raised where the route reads the body, which FastAPI's exception
middleware turns into the 413), so a client cannot make the extender buffer an unbounded body.
Add it with ``app.add_middleware(BodyLimitMiddleware, max_bytes=...)``.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException

Scope = dict[str, Any]
Message = dict[str, Any]


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
        body = orjson.dumps({"Error": f"request body over {self.max_bytes} bytes"})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._reply_413(send)
                    return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message: Message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, f"request body over {self.max_bytes} bytes")
            return message

        await self.app(scope, counting_receive, send)
