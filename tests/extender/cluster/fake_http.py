"""A scripted HTTP/1.1 server on loopback, standing in for the API server (tests of
``extender.cluster.loop_api`` and of the binds that write through it)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int


class Cut(bytes):
    """Bytes written, then the connection closed."""


Answer = Callable[[Seen], bytes | None]
"""The raw bytes to write for a request (``Cut``: then close); None: close without a word."""


def reply(status: int, body: bytes = b'{"kind":"Status"}', phrase: str = "OK", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


@dataclass
class FakeServer:
    """An HTTP/1.1 server on 127.0.0.1 answering every request with ``answer``."""

    answer: Answer
    tls: ssl.SSLContext | None = None
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    closed_by_client: int = 0
    port: int = 0
    _server: Any = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def __aenter__(self) -> FakeServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in self._writers:
            writer.close()
        await asyncio.sleep(0)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        number = self.connections
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                line, *lines = head.decode().split("\r\n")
                method, path, _ = line.split(" ")
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                seen = Seen(method, path, headers, body, number)
                self.seen.append(seen)
                out = self.answer(seen)
                if out is None:
                    return
                await asyncio.sleep(0)
                writer.write(out)
                await writer.drain()
                if isinstance(out, Cut) or b"Connection: close" in out:
                    return
        finally:
            self.open_now -= 1
            writer.close()


def ok(seen: Seen) -> bytes:
    return reply(201, b'{"kind":"Status","status":"Success"}', "Created")
