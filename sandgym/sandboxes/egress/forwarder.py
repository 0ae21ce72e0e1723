"""Host side of the egress path: each sandbox's unix socket -> squid, from its own address.

A sandbox has no network; execd's relay inside turns 127.0.0.1:3128 into connections on a
unix socket in the sandbox's socket directory. Here, one asyncio loop in a daemon thread
accepts on every such socket and connects to squid from the loopback address leased to that
sandbox (127.77.x.y), which is how squid knows whose policy applies. The sandbox cannot
choose its source address: it never touches a TCP socket on the host.

A server about to restart `drain`s: it stops accepting (the relay in each sandbox waits for
the next server's listener) and lets transfers in progress finish before it goes; idle
connections (a client's pooled keep-alive tunnel) are not waited for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK = 1 << 16
# Connections one sandbox may hold open through the proxy at once (each costs two fds here).
MAX_CONNECTIONS = 256
# A transfer whose bytes stopped for this long counts as idle at a drain (a pooled keep-alive
# tunnel); a pause shorter than this (a slow remote, a sandbox starved of CPU) does not.
QUIET_S = 2.0


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, moved: Callable[[], None], waiting: list[int]
) -> None:
    try:
        while data := await reader.read(CHUNK):
            moved()
            writer.write(data)
            # A reader slower than the sender (a sandbox under load) stalls the transfer
            # here: no byte moves, yet it is busy (`waiting` tells the drain so).
            waiting[0] += 1
            try:
                await writer.drain()
            finally:
                waiting[0] -= 1
                moved()
    except (ConnectionError, OSError, asyncio.CancelledError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            writer.close()


class EgressForwarder:
    """Unix-socket listeners forwarding to squid; one loop thread for all of them.

    `proxy_port()` returns the proxy's port, starting it again first if it died (blocking;
    called on the first connection and whenever connecting to the proxy fails)."""

    def __init__(self, proxy_port: Callable[[], int]) -> None:
        self._proxy_port = proxy_port
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: dict[str, asyncio.AbstractServer] = {}
        # open connection -> (when it last moved bytes (loop time), its pipes waiting on a slow reader)
        self._active: dict[int, tuple[float, list[int]]] = {}
        self._lock = threading.Lock()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="sandgym-egress", daemon=True)
                t.start()
                self._loop, self._thread = loop, t
            return self._loop

    def listen(self, sock_path: str | os.PathLike[str], src: str) -> None:
        """Accept on `sock_path` (created, mode 0666) and forward each connection to the
        proxy from `src`. Blocking; call from a worker thread."""
        loop = self._ensure_loop()
        fut = asyncio.run_coroutine_threadsafe(self._listen(str(sock_path), src), loop)
        fut.result(timeout=30)

    async def _connect(self, src: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            if self._port is None or attempt:
                self._port = await loop.run_in_executor(None, self._proxy_port)
            try:
                return await asyncio.open_connection("127.0.0.1", self._port, local_addr=(src, 0))
            except OSError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _listen(self, path: str, src: str) -> None:
        limit = asyncio.Semaphore(MAX_CONNECTIONS)

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            if limit.locked():
                cw.close()
                return
            async with limit:
                try:
                    ur, uw = await self._connect(src)
                except Exception as exc:
                    log.warning("egress: cannot reach the proxy from %s: %r", src, exc)
                    cw.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    cw.close()
                    return
                loop = asyncio.get_running_loop()
                key = id(cw)
                waiting = [0]

                def moved() -> None:
                    self._active[key] = (loop.time(), waiting)

                moved()
                try:
                    await asyncio.gather(_pipe(cr, uw, moved, waiting), _pipe(ur, cw, moved, waiting))
                finally:
                    self._active.pop(key, None)
                    cw.close()
                    uw.close()

        Path(path).unlink(missing_ok=True)
        server = await asyncio.start_unix_server(handle, path, limit=CHUNK)
        os.chmod(path, 0o666)
        self._servers[path] = server

    def close(self, sock_path: str | os.PathLike[str]) -> None:
        """Stop accepting on `sock_path` (its open connections end with the sandbox)."""
        loop = self._loop
        if loop is None:
            return

        async def stop() -> None:
            server = self._servers.pop(str(sock_path), None)
            if server is not None:
                server.close()

        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=10)
        except Exception as exc:
            log.debug("egress: closing %s: %r", sock_path, exc)

    def drain(self, timeout_s: float, quiet_s: float = QUIET_S) -> int:
        """Stop accepting on every socket, then wait (up to `timeout_s`) until no open
        connection is busy: none has moved a byte for `quiet_s` or waits for its reader to
        take what it has. Returns how many are still busy. Blocking."""
        loop = self._loop
        if loop is None:
            return 0

        async def stop_accepting() -> None:
            for server in self._servers.values():
                server.close()

        async def busy() -> int:
            now = asyncio.get_running_loop().time()
            return sum(1 for last, waiting in self._active.values() if now - last < quiet_s or waiting[0])

        asyncio.run_coroutine_threadsafe(stop_accepting(), loop).result(timeout=10)
        deadline = time.monotonic() + timeout_s
        while (left := asyncio.run_coroutine_threadsafe(busy(), loop).result(timeout=10)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def shutdown(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return

        async def stop_all() -> None:
            for s in self._servers.values():
                s.close()
            self._servers.clear()

        try:
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(timeout=10)
        except Exception:
            pass
        loop.call_soon_threadsafe(loop.stop)
