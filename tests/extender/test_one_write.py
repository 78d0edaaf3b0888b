"""Each response leaves in one ``transport.write`` (``extender.server.OneWrite``).

The protocol tests drive gpufrac's uvicorn protocol over a recording transport, request
bytes in, writes out; the live tests check the answers a client reads over loopback from
the real app under uvicorn (pipelined requests, ``HEAD``, ``Connection: close``,
``Expect: 100-continue``).
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from extender.admin_config import scoring_config
from extender.cache import GpuCache
from extender.server import protocol_class
from extender.translate.outbound import NODE_UNKNOWN_MESSAGE
from scoring.scorer import build_scorer
from tests.extender.helpers import LiveServer


class RecordingTransport(asyncio.Transport):
    """What the protocol writes, one entry per ``write``."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8888), "peername": ("127.0.0.1", 40000)}.get(name, default)


def app_answering(body: bytes, chunks: int = 1, status: int = 200) -> Any:
    """An ASGI app answering ``body`` (split into ``chunks`` body messages) with a length."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        size = -(-len(body) // chunks) if body else 0
        parts = [body[i:i + size] for i in range(0, len(body), size)] if body else [b""]
        for i, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})
    return app


def exchange(app: Any, request: bytes) -> RecordingTransport:
    """Feed ``request`` to gpufrac's protocol serving ``app``; the transport once every
    response task has finished."""
    async def run() -> RecordingTransport:
        cls = protocol_class(10.0)
        config = uvicorn.Config(app, http=cls, lifespan="off", log_level="warning")
        config.load()
        transport = RecordingTransport()
        protocol = cls(config=config, server_state=ServerState(), app_state={})
        protocol.connection_made(transport)
        protocol.data_received(request)
        for _ in range(200):
            await asyncio.sleep(0)
            if not protocol.tasks and not protocol.pipeline:
                break
        assert not protocol.tasks, "the response did not finish"
        protocol.connection_lost(None)
        return transport
    return asyncio.run(run())


POST = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_head_and_body_go_out_in_one_write() -> None:
    t = exchange(app_answering(b'{"NodeNames":["n1"]}'), POST)
    assert len(t.writes) == 1
    head, body = t.writes[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 20" in head
    assert body == b'{"NodeNames":["n1"]}'


def test_a_chunked_body_joins_the_head_to_its_first_chunk_only() -> None:
    t = exchange(app_answering(b"abcdef", chunks=3), POST)
    assert len(t.writes) == 3
    assert t.writes[0].endswith(b"\r\n\r\nab") and t.writes[1:] == [b"cd", b"ef"]


def test_an_empty_body_and_a_head_request_still_send_the_head() -> None:
    empty = exchange(app_answering(b"", status=204), POST)
    assert len(empty.writes) == 1 and empty.writes[0].startswith(b"HTTP/1.1 204 ")
    head = exchange(app_answering(b"xyz"), b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(head.writes) == 1  # no body write: the response's end sends the head
    assert head.writes[0].startswith(b"HTTP/1.1 200 ") and head.writes[0].endswith(b"\r\n\r\n")


def test_connection_close_sends_the_response_before_closing() -> None:
    t = exchange(app_answering(b"bye"), POST.replace(b"Host: x", b"Host: x\r\nConnection: close"))
    assert t.closed and len(t.writes) == 1 and t.writes[0].endswith(b"\r\n\r\nbye")


def test_100_continue_goes_out_before_the_app_answers() -> None:
    request = b"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}"
    t = exchange(app_answering(b"ok"), request)
    assert t.writes[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert len(t.writes) == 2 and t.writes[1].startswith(b"HTTP/1.1 200 ") and t.writes[1].endswith(b"ok")


def test_pipelined_requests_get_one_write_each_in_order() -> None:
    def numbered() -> Any:
        seen = [0]

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            seen[0] += 1
            body = str(seen[0]).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        return app

    t = exchange(numbered(), POST * 3)
    assert [w.rsplit(b"\r\n\r\n", 1)[1] for w in t.writes] == [b"1", b"2", b"3"]


def read_responses(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` (head, body) pairs read from ``sock`` (bodies by content-length)."""
    buf, out = b"", list[tuple[bytes, bytes]]()
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(out)} responses"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if head.startswith(b"HTTP/1.1 100 "):
            out.append((head, b""))
            continue
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk
            buf += chunk
        out.append((head, buf[:length]))
        buf = buf[length:]
    return out


def test_the_real_app_answers_pipelined_head_and_continue_requests_whole() -> None:
    cache = GpuCache(build_scorer(scoring_config("default")))
    filter_body = b'{"Pod":{"metadata":{"name":"p","uid":"u"}},"NodeNames":["n1"]}'
    post = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(filter_body), filter_body)
    with LiveServer(cache) as srv, socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(post + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + post)
        answers = read_responses(sock, 3)
        assert [a[0].split(b" ")[1] for a in answers] == [b"200"] * 3
        # An empty cache (the path that answered 500 before 7dcd11a): n1 fails as unknown.
        assert json.loads(answers[0][1]) == {"Nodes": None, "NodeNames": [], "FailedNodes": {"n1": NODE_UNKNOWN_MESSAGE},
                                             "FailedAndUnresolvableNodes": {}, "Error": ""}
        assert answers[2][1] == answers[0][1] and json.loads(answers[1][1])
        sock.sendall(post.replace(b"Host: x", b"Host: x\r\nExpect: 100-continue"))
        cont, answer = read_responses(sock, 2)
        assert cont[0].startswith(b"HTTP/1.1 100 ") and answer[1] == answers[0][1]
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        (head, _), = read_responses(sock, 1)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert sock.recv(1024) == b""  # then closed
