"""Reading responses of the ``kubernetes`` client called with ``_preload_content=False``.

gpufrac asks the client for raw responses (plain API JSON for ``translate``, and no model
deserialization). Such a response holds its pooled TLS connection until its body is read
and the connection released; one left unread makes the next call open a new connection
and pay a handshake. Every raw call goes through one of these two functions.
"""

from __future__ import annotations

from typing import Any

import orjson


def response_json(resp: Any) -> dict[str, Any]:
    """Body of a raw response as JSON, its connection given back to the pool."""
    data = resp.data
    resp.release_conn()
    return orjson.loads(data)  # type: ignore[no-any-return]


def drain(resp: Any) -> None:
    """Read and release a raw response whose body is not needed."""
    resp.data  # noqa: B018 - reading the body is what frees the connection
    resp.release_conn()
