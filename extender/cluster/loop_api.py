"""``LoopApi``: the bind's Binding written from the event loop, on kept-alive HTTP/1.1 connections.

A bind that writes its Binding through the ``kubernetes`` client runs in a worker thread
(the client blocks): the hop there and back, the GIL passed between the thread and the event
loop, and urllib3 with ``http.client``'s header parsing (the ``email`` package) cost more
CPU than the rest of the bind. ``LoopApi`` sends the same request from the event loop: the
request head written from a template, the response read by ``httptools`` (the C parser
uvicorn serves the verbs with), connections kept alive in a small pool, TLS by ``ssl`` with
the kubeconfig's CA, client certificate and bearer token (decision record 0033 has the
numbers and the libraries measured: the ``kubernetes`` client, aiohttp, httpx).

What it speaks is narrow on purpose: one request at a time per connection, a bounded
response read whole, no proxy, no redirects. ``LoopApi.for_client`` builds one from the
``kubernetes`` client's configuration only where that configuration is a plain one (``http``
or ``https`` host, no proxy, no ``assert_hostname`` override); elsewhere it returns None and
binds go through the client in a worker, as before.

Every answer is untrusted: a response larger than ``max_response_bytes``, one that does not
parse as HTTP/1.1, or no answer within the timeout closes its connection and raises
``kubernetes.client.rest.ApiException`` (status 0 when nothing was answered), as
``podspec.kubeio.write_json`` does, so the bind handles both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson
from kubernetes.client.rest import ApiException

MAX_RESPONSE_BYTES = 1 << 20
"""The largest response body read, bytes: a Binding is answered with a short ``Status``."""

MAX_CONNECTIONS = 16
"""Connections to the API server at most; a request past them waits for one to be free."""

MAX_IDLE = 8
"""Idle connections kept for the next request, at most."""

JSON = "application/json"


class _Exchange(asyncio.Protocol):
    """One connection: a request written, its response parsed (``httptools``), then the next."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, str, bytes]] | None = None
        self.status = 0
        self.phrase = ""
        self.chunks: list[bytes] = []
        self.size = 0
        self.keep_alive = True
        self.answered = False
        """Bytes of the current response arrived (a retry would not be safe to judge)."""
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # nothing asked: the connection is not in a state to reuse
            self._fail(ConnectionError("the API server sent bytes no request asked for"))
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"the API server's answer is not HTTP/1.1: {exc}"))

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionError("the API server closed the connection"))

    # httptools callbacks
    def on_status(self, phrase: bytes) -> None:
        self.phrase = phrase[:64].decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = bool(self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:
            self._fail(ConnectionError(f"the API server's answer is over {self.max_bytes} bytes"))
            return
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        body, self.chunks, self.size = b"".join(self.chunks), [], 0
        if waiter is not None and not waiter.done():
            waiter.set_result((self.status, self.phrase, body))

    # the pool's side
    def send(self, request: bytes) -> asyncio.Future[tuple[int, str, bytes]]:
        """Write ``request``; the future of its ``(status, reason phrase, body)``."""
        assert self.transport is not None and self.waiter is None
        self.answered, self.phrase = False, ""
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def usable(self) -> bool:
        return not self.closed and self.keep_alive and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.keep_alive = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class LoopApi:
    """JSON writes to the API server from the running event loop.

    Parameters
    ----------
    host : str
        ``http://`` or ``https://`` URL of the API server, optionally with a path prefix.
    tls : ssl.SSLContext, optional
        Required for ``https``: the CA, the client certificate and hostname checking.
    server_hostname : str, optional
        The name the server's certificate is checked against (and sent as SNI); the host's
        by default.
    headers : callable returning a mapping of str to str
        Headers added to every request (credentials: called per request, so a bearer token
        the configuration refreshes is read fresh).
    max_connections, max_idle : int
        ``MAX_CONNECTIONS``, ``MAX_IDLE``.
    max_response_bytes : int
        ``MAX_RESPONSE_BYTES``.

    Raises
    ------
    ValueError
        The host is not an ``http``/``https`` URL, or ``https`` without ``tls``.

    Notes
    -----
    Connections belong to the event loop they were opened on; a call from another loop (a
    test's) drops them and opens its own. Not thread-safe: call from the loop only.
    """

    def __init__(self, host: str, tls: ssl.SSLContext | None = None, server_hostname: str | None = None,
                 headers: Callable[[], Mapping[str, str]] = dict, max_connections: int = MAX_CONNECTIONS,
                 max_idle: int = MAX_IDLE, max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        url = urlsplit(host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {host!r}")
        if url.scheme == "https" and tls is None:
            raise ValueError("https needs a TLS context")
        self._host, self._port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._tls = tls if url.scheme == "https" else None
        self._sni = server_hostname or self._host
        netloc = url.netloc.rpartition("@")[2]
        self._head = f"Host: {netloc}\r\n"
        self._headers = headers
        self._max_connections, self._max_idle = max_connections, max_idle
        self._max_bytes = max_response_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[_Exchange] = []
        self._slots: asyncio.Semaphore | None = None

    @classmethod
    def for_client(cls, api: Any) -> LoopApi | None:
        """The ``LoopApi`` of a ``kubernetes.client.CoreV1Api``'s configuration, or None where
        it is not a plain one (module notes): binds then go through the client.

        Raises
        ------
        ssl.SSLError, OSError
            The configuration's CA or client certificate files cannot be read.
        """
        from kubernetes.client import Configuration

        client: Any = getattr(api, "api_client", None)
        cfg = getattr(client, "configuration", None)
        if client is None or not isinstance(cfg, Configuration) or cfg.proxy or cfg.assert_hostname is not None:
            return None
        if urlsplit(cfg.host).scheme not in ("http", "https"):
            return None
        tls = None
        if cfg.host.startswith("https"):
            tls = ssl.create_default_context(cafile=cfg.ssl_ca_cert or _certifi())
            if not cfg.verify_ssl:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                tls.load_cert_chain(cfg.cert_file, cfg.key_file)
        defaults = dict(client.default_headers or {})

        def headers() -> dict[str, str]:
            out = dict(defaults)
            for auth in cfg.auth_settings().values():
                if auth.get("in") == "header" and auth.get("value"):
                    out[auth["key"]] = auth["value"]
            return out

        return cls(cfg.host, tls, cfg.tls_server_name or None, headers)

    async def write_json(self, method: str, path: str, body: Any, timeout_s: float) -> dict[str, Any]:
        """``podspec.kubeio.write_json`` from the event loop: one JSON write, its JSON answer.

        Parameters
        ----------
        method : str
            ``"POST"`` or ``"PUT"``.
        path : str
            API path (``podspec.kubeio.core_path``), without the host's prefix.
        body : object
            JSON-serializable (``orjson``).
        timeout_s : float
            Connect plus answer limit, seconds.

        Returns
        -------
        dict
            The answer's body (a ``Status`` or the written object); empty when not JSON.

        Raises
        ------
        kubernetes.client.rest.ApiException
            The API server answered outside 2xx (``status``, ``reason``, ``body``), or did not
            answer (``status`` 0, the reason named).
        """
        status, phrase, data = await self.request(method, path, orjson.dumps(body), timeout_s)
        if not 200 <= status <= 299:
            refused = ApiException(status=status, reason=phrase or _reason(data))
            refused.body = data
            raise refused
        try:
            got = orjson.loads(data)
        except orjson.JSONDecodeError:
            return {}
        return got if isinstance(got, dict) else {}

    async def request(self, method: str, path: str, body: bytes, timeout_s: float) -> tuple[int, str, bytes]:
        """Send one request with a JSON body; ``(status, reason phrase, body)`` of the answer.

        A request written on a kept-alive connection that the server had closed (no byte of
        an answer came) is sent once more on a new one; every other failure is raised.

        Raises
        ------
        kubernetes.client.rest.ApiException
            Status 0: no answer within ``timeout_s``, the connection failed, or the answer
            was not HTTP/1.1 or was too large.
        """
        slots = self._bind_loop()
        head = "".join(f"{k}: {v}\r\n" for k, v in self._headers().items() if "\r" not in k + v and "\n" not in k + v)
        request = (f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._head}Content-Type: {JSON}\r\n"
                   f"Accept: {JSON}\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode() + body
        try:
            async with asyncio.timeout(timeout_s), slots:
                for attempt in (0, 1):
                    conn, reused = await self._connection()
                    try:
                        answer = await conn.send(request)
                    except (ConnectionError, OSError):
                        conn.close()
                        if reused and not conn.answered and attempt == 0:
                            continue  # the server closed an idle connection as we wrote: once more
                        raise
                    except BaseException:  # the timeout, a cancellation: the answer would come to no one
                        conn.close()
                        raise
                    self._give_back(conn)
                    return answer
        except TimeoutError:
            raise ApiException(status=0, reason=f"no answer from the API server in {timeout_s:g} s") from None
        except (ConnectionError, OSError, ssl.SSLError) as exc:
            raise ApiException(status=0, reason=f"no answer from the API server: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def close(self) -> None:
        """Close the idle connections."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    def _bind_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._slots is None:
            self._idle = []  # another loop's connections cannot be used here (and are left to it)
            self._loop, self._slots = loop, asyncio.Semaphore(self._max_connections)
        return self._slots

    async def _connection(self) -> tuple[_Exchange, bool]:
        """An idle connection that is still open, or a new one; and whether it was kept."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn, True
            conn.close()
        assert self._loop is not None
        _, conn = await self._loop.create_connection(
            lambda: _Exchange(self._max_bytes), self._host, self._port, ssl=self._tls,
            server_hostname=self._sni if self._tls is not None else None)
        return conn, False

    def _give_back(self, conn: _Exchange) -> None:
        if conn.usable() and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()


def _reason(data: bytes) -> str:
    """A ``Status`` answer's ``reason`` (``Conflict``, ``NotFound``), else ""."""
    with contextlib.suppress(orjson.JSONDecodeError):
        got = orjson.loads(data)
        if isinstance(got, dict) and isinstance(got.get("reason"), str):
            return str(got["reason"])[:64]
    return ""


def _certifi() -> str | None:
    """certifi's bundle, as the ``kubernetes`` client uses without a CA file (None without certifi)."""
    try:
        import certifi
    except ImportError:  # pragma: no cover - a dependency of the kubernetes client
        return None
    return str(certifi.where())
