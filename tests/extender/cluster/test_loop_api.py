"""``LoopApi`` against a scripted HTTP/1.1 server on loopback: what it sends, what it keeps,
and every way an answer can go wrong (the API server is a neighbour: untrusted)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cluster.loop_api import LoopApi
from harness.pki import make_pki
from tests.extender.cluster.fake_http import Cut, FakeServer, Seen, ok, reply

Runner = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, None]], None]:
    """Runs a test's coroutine on asyncio's loop, then on uvloop's (uvicorn serves the extender
    on uvloop, whose TLS transport differs)."""
    import uvloop
    return asyncio.run if request.param == "asyncio" else uvloop.run


def test_a_write_is_one_request_with_the_credentials_and_keeps_its_connection(run: Runner) -> None:
    async def go() -> None:
        async with FakeServer(ok) as srv:
            token = iter(["Bearer one", "Bearer two"])
            api = LoopApi(srv.url, headers=lambda: {"authorization": next(token)})
            got = await api.write_json("POST", "/api/v1/namespaces/ns/pods/p/binding", {"a": 1}, 2.0)
            assert got == {"kind": "Status", "status": "Success"}
            await api.write_json("POST", "/api/v1/namespaces/ns/pods/q/binding", {"b": 2}, 2.0)
            first, second = srv.seen
            assert (first.method, first.path, first.body) == ("POST", "/api/v1/namespaces/ns/pods/p/binding", b'{"a":1}')
            assert first.headers["content-type"] == "application/json" == first.headers["accept"]
            assert first.headers["host"] == f"127.0.0.1:{srv.port}"
            # The token is read per request (a refreshed one is sent), the connection kept.
            assert (first.headers["authorization"], second.headers["authorization"]) == ("Bearer one", "Bearer two")
            assert (first.connection, second.connection, srv.connections) == (1, 1, 1)
            api.close()
    run(go())


def test_a_refusal_carries_the_status_the_reason_and_the_body(run: Runner) -> None:
    async def go() -> None:
        body = b'{"kind":"Status","reason":"Conflict","code":409}'
        async with FakeServer(lambda s: reply(409, body, "Conflict")) as srv:
            api = LoopApi(srv.url)
            with pytest.raises(ApiException) as info:
                await api.write_json("POST", "/x", {}, 2.0)
            assert (info.value.status, info.value.reason, info.value.body) == (409, "Conflict", body)
            # A refusal is an answer: the connection stays for the next request.
            await api.request("POST", "/y", b"{}", 2.0)
            assert srv.connections == 1
    run(go())


def test_an_idle_connection_the_server_closed_is_replaced_and_the_request_sent_once_more(run: Runner) -> None:
    answers = iter([ok, lambda s: None, ok])

    def answer(seen: Seen) -> bytes | None:
        return next(answers)(seen)

    async def go() -> None:
        async with FakeServer(answer) as srv:
            api = LoopApi(srv.url)
            await api.request("POST", "/a", b"{}", 2.0)
            status, _, _ = await api.request("POST", "/b", b"{}", 2.0)  # its first connection closes unanswered
            assert status == 201
            assert [(s.path, s.connection) for s in srv.seen] == [("/a", 1), ("/b", 1), ("/b", 2)]
    run(go())


def test_a_request_on_a_new_connection_or_an_answer_cut_short_is_not_sent_again(run: Runner) -> None:
    async def go() -> None:
        for answer in (lambda s: None, lambda s: Cut(reply(201, b"x" * 100)[:-50])):
            async with FakeServer(answer) as srv:
                api = LoopApi(srv.url)
                with pytest.raises(ApiException) as info:
                    await api.request("POST", "/a", b"{}", 2.0)
                assert info.value.status == 0 and "no answer from the API server" in info.value.reason
                assert len(srv.seen) == 1
    run(go())


@pytest.mark.parametrize("raw,message", [
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "is not HTTP/1.1"),
    (reply(201, b"x" * 5000), "is over 4096 bytes"),
    (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1001\r\n" + b"y" * 4097 + b"\r\n0\r\n\r\n",
     "is over 4096 bytes"),
])
def test_an_answer_that_is_not_http_or_too_large_is_refused_and_its_connection_closed(run: Runner, raw: bytes, message: str) -> None:
    async def go() -> None:
        async with FakeServer(lambda s: raw) as srv:
            api = LoopApi(srv.url, max_response_bytes=4096)
            with pytest.raises(ApiException) as info:
                await api.request("POST", "/a", b"{}", 2.0)
            assert info.value.status == 0 and message in info.value.reason
            await asyncio.sleep(0.05)
            assert srv.closed_by_client == 1 and api._idle == []
    run(go())


def test_a_chunked_answer_is_read_whole(run: Runner) -> None:
    raw = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n")

    async def go() -> None:
        async with FakeServer(lambda s: raw) as srv:
            assert await LoopApi(srv.url).write_json("POST", "/a", {}, 2.0) == {"a": 1}
    run(go())


def test_no_answer_in_time_is_a_refusal_and_the_connection_is_not_kept(run: Runner) -> None:
    async def go() -> None:
        gate = asyncio.Event()

        def never(seen: Seen) -> bytes | None:
            return None if gate.is_set() else b""  # writes nothing, keeps the connection open

        async with FakeServer(never) as srv:
            api = LoopApi(srv.url)
            with pytest.raises(ApiException) as info:
                await api.request("POST", "/a", b"{}", 0.2)
            assert info.value.status == 0 and "no answer from the API server in 0.2 s" in info.value.reason
            await asyncio.sleep(0.05)
            assert api._idle == [] and srv.closed_by_client == 1
    run(go())


def test_connection_close_is_honoured(run: Runner) -> None:
    async def go() -> None:
        async with FakeServer(lambda s: reply(201, extra="Connection: close\r\n")) as srv:
            api = LoopApi(srv.url)
            await api.request("POST", "/a", b"{}", 2.0)
            await api.request("POST", "/b", b"{}", 2.0)
            assert [s.connection for s in srv.seen] == [1, 2]
    run(go())


def test_concurrent_requests_open_at_most_max_connections(run: Runner) -> None:
    async def go() -> None:
        async with FakeServer(ok) as srv:
            api = LoopApi(srv.url, max_connections=2, max_idle=1)
            await asyncio.gather(*(api.request("POST", f"/{i}", b"{}", 5.0) for i in range(20)))
            assert len(srv.seen) == 20 and srv.most_open <= 2
    run(go())


def test_a_header_with_a_line_break_is_not_sent(run: Runner) -> None:
    async def go() -> None:
        async with FakeServer(ok) as srv:
            api = LoopApi(srv.url, headers=lambda: {"authorization": "Bearer x\r\nX-Evil: 1", "x-fine": "y"})
            await api.request("POST", "/a", b"{}", 2.0)
            (seen,) = srv.seen
            assert "authorization" not in seen.headers and "x-evil" not in seen.headers and seen.headers["x-fine"] == "y"
    run(go())


def test_tls_checks_the_server_against_the_ca(run: Runner, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    other = make_pki(tmp_path / "other")
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(pki.serving_cert, pki.serving_key)

    async def go() -> None:
        async with FakeServer(ok, tls=serving) as srv:
            good = ssl.create_default_context(cafile=str(pki.ca_cert))
            assert (await LoopApi(srv.url, good).request("POST", "/a", b"{}", 5.0))[0] == 201
            wrong = ssl.create_default_context(cafile=str(other.ca_cert))
            with pytest.raises(ApiException) as info:
                await LoopApi(srv.url, wrong).request("POST", "/a", b"{}", 5.0)
            assert info.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in info.value.reason
            assert len(srv.seen) == 1
    run(go())


def test_for_client_takes_a_plain_configuration_and_leaves_the_rest_to_the_client(run: Runner, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    cert, key = pki.client("gpufrac", ["gpufrac"])
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file = "https://127.0.0.1:6443", str(pki.ca_cert), str(cert), str(key)
    cfg.api_key = {"authorization": "Bearer t"}
    api = client.CoreV1Api(client.ApiClient(cfg))
    built = LoopApi.for_client(api)
    assert built is not None and built._headers()["authorization"] == "Bearer t"
    assert LoopApi.for_client(object()) is None  # a test's fake
    cfg.proxy = "http://proxy:3128"
    assert LoopApi.for_client(api) is None
    cfg.proxy, cfg.assert_hostname = None, "other.example"
    assert LoopApi.for_client(api) is None
    with pytest.raises(ValueError, match="not an http"):
        LoopApi("unix:///run/api.sock")
    with pytest.raises(ValueError, match="needs a TLS context"):
        LoopApi("https://127.0.0.1:6443")
