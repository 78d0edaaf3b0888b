"""A TCP proxy on loopback that delays every chunk sent to the server: a slow API server; and
that can black-hole the connections open at a moment (``black_hole``): from then on they
carry nothing either way and are never closed, as a NAT or load balancer that dropped the
flows leaves them (no FIN, no RST), while new connections pass as before.

TLS passes through untouched (the API server's certificate names 127.0.0.1, the proxy
listens there too), so a client's kubeconfig only changes its port. Bounded: at most
``MAX_CONNECTIONS`` connections at once (later ones are closed), 64 KiB per read.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from types import TracebackType

from harness.processes import LOOPBACK, free_port

MAX_CONNECTIONS = 256
CHUNK_BYTES = 64 * 1024


class LatencyProxy:
    """``with LatencyProxy(port, delay_s) as proxy:`` forwards ``proxy.port`` to ``port``.

    Parameters
    ----------
    target_port : int
        The server's port on 127.0.0.1.
    delay_s : float
        Added before every chunk the client sends (each request pays it at least once).
    """

    def __init__(self, target_port: int, delay_s: float) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)
        self._open = 0
        self._server: asyncio.base_events.Server | None = None
        self._opened = 0  # connections accepted so far: each one's number
        self._holed_upto = 0  # connections numbered up to this one carry nothing

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def black_hole(self) -> int:
        """Silence every connection open now (module notes); the number of them."""
        self._holed_upto = self._opened
        return self._open

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, LOOPBACK, self.port)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        # Connections still open (black-holed ones wait forever): end them inside the loop.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            writer.close()
            return
        self._open += 1
        self._opened += 1
        number = self._opened
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.target_port)
        except OSError:
            self._open -= 1
            writer.close()
            return
        try:
            await asyncio.gather(self._pump(reader, up_writer, self.delay_s, lambda: number <= self._holed_upto),
                                 self._pump(up_reader, writer, 0.0, lambda: number <= self._holed_upto))
        finally:
            self._open -= 1
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float,
                    holed: Callable[[], bool]) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK_BYTES):
                if delay_s:
                    await asyncio.sleep(delay_s)
                if holed():
                    continue  # dropped: the other side never hears of it, nor of a close
                writer.write(data)
                await writer.drain()
            if holed():
                await asyncio.Event().wait()  # keep the silent side open until the proxy stops
        with contextlib.suppress(OSError):
            writer.close()
