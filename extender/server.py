"""Run the app under uvicorn with a read deadline on every request.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but has no deadline for
reading a request: a client that connects and sends half a header, or a body that never
ends, holds its connection forever. ``ReadDeadlineProtocol`` adds one to uvicorn's
httptools protocol: a connection that has not delivered a whole request
``read_timeout_s`` after it connected (or after the first byte of its next request) is
closed. The route never sees such a request, and no worker thread waits on it.

It also writes each response in one ``transport.write``: uvicorn writes the status line and
headers on ``http.response.start`` and the body on ``http.response.body``, two sends (and two
TCP segments for kube-scheduler to read) where one will do. ``OneWrite`` holds the head until
the body's first bytes, the response's end or a close (decision record 0030).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from extender.settings import Settings

log = logging.getLogger(__name__)


class ReadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a per-request read deadline (``read_timeout_s``)."""

    read_timeout_s: float = 10.0
    _read_timer: asyncio.TimerHandle | None = None

    # uvicorn's signature takes asyncio.Transport where asyncio.Protocol's takes BaseTransport.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # a new request's cycle
            OneWrite.wrap(cycle)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _expired(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            log.info("closing a connection that did not send a whole request in %.1fs", self.read_timeout_s)
            self.transport.close()


class OneWrite:
    """The transport one response cycle writes to: its head goes out with the first body bytes.

    uvicorn's cycle writes the status line and headers, then each body chunk. The head
    (the first write after the response started) is held and joined to the next write;
    the response's end (a ``HEAD`` answer has no body write) or a close sends it alone. A
    ``100 Continue`` (written before the response starts) passes straight through.
    """

    __slots__ = ("_cycle", "_transport", "_head", "_head_sent")

    def __init__(self, cycle: RequestResponseCycle, transport: asyncio.Transport) -> None:
        self._cycle = cycle
        self._transport = transport
        self._head: bytes | None = None
        self._head_sent = False

    @classmethod
    def wrap(cls, cycle: RequestResponseCycle) -> None:
        """Give ``cycle`` a ``OneWrite`` over its transport; its end flushes the head."""
        one = cls(cycle, cycle.transport)
        done = cycle.on_response

        def on_response() -> None:
            one.flush()
            done()

        cycle.transport = one  # type: ignore[assignment]  # the three methods the cycle calls
        cycle.on_response = on_response

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif not self._head_sent and self._cycle.response_started:
            self._head_sent = True  # this write is the head
            self._head = data
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send a held head alone (the response ended without a body write)."""
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()


def protocol_class(read_timeout_s: float) -> type[ReadDeadlineProtocol]:
    """``ReadDeadlineProtocol`` with its deadline set (uvicorn instantiates the class)."""
    return type("ReadDeadlineProtocol", (ReadDeadlineProtocol,), {"read_timeout_s": read_timeout_s})


HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""What the plain health listener serves; everything else there is 404."""


def health_only(app: Any) -> Any:
    """An ASGI app serving only ``HEALTH_PATHS`` of ``app`` (and no lifespan of its own)."""
    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in HEALTH_PATHS:
            await app(scope, receive, send)
            return
        if scope["type"] == "http":
            body = b'{"Error":"not found: the verbs are on the extender port"}'
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
    return wrapped


def serve(app: Any, settings: Settings) -> None:
    """Run the extender (and its health listener, when ``settings.health_port`` is set)
    until SIGTERM/SIGINT; either server stopping stops both."""
    main = uvicorn.Server(uvicorn_config(app, settings))
    if settings.health_port is None:
        main.run()
        return
    health = uvicorn.Server(uvicorn.Config(
        health_only(app), host=settings.health_host, port=settings.health_port, lifespan="off",
        log_level=settings.log_level, access_log=False, timeout_keep_alive=settings.timeout_keep_alive_s,
        http=protocol_class(settings.request_read_timeout_s)))

    async def both() -> None:
        tasks = [asyncio.ensure_future(main.serve()), asyncio.ensure_future(health.serve())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        main.should_exit = health.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(both())


def uvicorn_tls(cert_file: Path | None, key_file: Path | None, client_ca_file: Path | None) -> dict[str, Any]:
    """uvicorn's TLS arguments: HTTPS with ``cert_file`` and ``key_file`` (none without a
    certificate), requiring client certificates ``client_ca_file`` signed when it is given."""
    if cert_file is None:
        return {}
    tls: dict[str, Any] = {"ssl_certfile": str(cert_file), "ssl_keyfile": str(key_file)}
    if client_ca_file is not None:
        tls |= {"ssl_ca_certs": str(client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return tls


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The uvicorn config for ``settings``: address, TLS, keep-alive and read deadlines."""
    tls = uvicorn_tls(settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                          access_log=False, timeout_keep_alive=settings.timeout_keep_alive_s,
                          http=protocol_class(settings.request_read_timeout_s), **tls)
