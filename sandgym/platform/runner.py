"""`sandgym serve`'s process: uvicorn on a listening socket that outlives the process, with
restarts clients do not notice.

- SIGTERM / SIGINT: **drain**. Stop accepting (the socket stays open in whoever holds it:
  systemd's socket unit, or nobody when we bound it ourselves), close idle keep-alive
  connections once clients have moved off them (every response says `Connection: close`
  meanwhile, and one already under way closes its connection behind it), let in-flight
  requests finish for up to `drain_s`, cut what is still running past that, detach from
  the sandboxes (they keep running for the next server on the same state) and exit 0.
  Live-process streams are ended at once: the SDK re-attaches to the process (its
  `Connect`), which the next server serves.
- SIGHUP: **re-exec in place**. The same drain, then the process execs its own command line
  again (same pid, so systemd's main pid stays), handing the listening socket over as fd 3
  (sockets.py). New connections wait in the kernel's backlog meanwhile; the new process
  re-adopts the sandboxes before it accepts the first one.
- SIGTERM / SIGINT during a SIGHUP's drain turn the re-exec into a stop; SIGHUP during a
  stop's drain is ignored; a second SIGINT cuts the drain short.
- No signal is lost across the re-exec: they are blocked before the exec and the new process
  records them from its first line (`hold_signals`) until the server takes them over.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import math
import os
import signal
import socket
import sys
import termios
import threading
import time
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import uvicorn

from . import sockets

log = logging.getLogger("sandgym.serve")

DEFAULT_DRAIN_S = 20.0  # below prime-sandboxes' 30 s read timeout, which queued requests wait out
QUIET_S = 0.5  # no request started or ended for this long: idle connections are not in use
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def hold_signals() -> list[int]:
    """Record SIGINT/SIGTERM/SIGHUP from now on (in the returned list) instead of dying of
    them, and unblock them (a re-exec hands them over blocked): the server acts on them
    once it runs. Call first thing, before the slow start-up."""
    seen: list[int] = []
    if threading.current_thread() is threading.main_thread():
        for sig in HANDLED:
            signal.signal(sig, lambda signum, frame: seen.append(signum))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
    return seen


class PlatformServer(uvicorn.Server):
    """uvicorn.Server with the signals above; `run_forever` re-execs on SIGHUP."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_drain: Callable[[], None] | None = None,
        held: list[int] | None = None,
        traffic: Traffic | None = None,
    ) -> None:
        super().__init__(config)
        self._traffic = traffic
        self.restart = False
        self.signal_name: str | None = None
        self._on_drain = on_drain
        self._held = held if held is not None else []

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises the signal after its shutdown (exit status 128+N); a drained
        # server exits 0, and SIGHUP is ours.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self._on_signal) for sig in HANDLED}
        for sig in self._held:  # arrived during start-up
            self._on_signal(sig, None)
        self._held.clear()
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if self.should_exit:
            if sig == signal.SIGINT and not self.restart:
                self.force_exit = True  # a second Ctrl-C: stop waiting for in-flight requests
            if sig != signal.SIGHUP and self.restart:
                log.warning("sandgym serve: %s during the re-exec's drain: stopping instead", name)
                self.restart = False
                self.signal_name = name
            return
        self.signal_name = name
        self.restart = sig == signal.SIGHUP
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        what = "re-executing" if self.restart else "stopping"
        log.warning(
            "sandgym serve: %s, %s: draining in-flight requests (up to %ss); new connections wait",
            self.signal_name or "shutdown", what, self.config.timeout_graceful_shutdown,
        )
        if self._on_drain is not None:
            self._on_drain()
        for server in self.servers:
            server.close()  # stop accepting; what arrives from now on waits in the backlog
        if self._traffic is not None:
            self._traffic.draining = True
            bound = self.config.timeout_graceful_shutdown
            spent = await self._quiesce(float(bound) if bound is not None else DEFAULT_DRAIN_S)
            if bound is not None:
                self.config.timeout_graceful_shutdown = max(0, math.ceil(bound - spent))
        await super().shutdown(sockets=sockets)

    async def _quiesce(self, bound_s: float) -> float:
        """uvicorn closes every kept-alive connection without a request in progress at once;
        a client sending its next request on one at that moment gets a reset (and the SDK
        does not retry an exec). So first let the clients move off them: every response
        from now on says `Connection: close` (Traffic), and one in progress closes its
        connection behind it, so a busy client gets its answer and opens a new connection,
        which waits in the backlog for the next server. Wait until no connection is idle, or
        no request has started or ended for QUIET_S and no idle connection holds unread bytes
        (at most `bound_s`): what is left idle then is not in use. Returns the time spent."""
        assert self._traffic is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        for connection in list(self.server_state.connections):
            if not _idle(connection):
                # Its response started before the drain, without `Connection: close`: the
                # connection closes right behind the response's last byte (uvicorn's own
                # shutdown step for busy connections), so the client sees the end and the close
                # together. Left open, it would turn idle just as its client sends the next
                # request, and closing it later would race that request (a reset in CI).
                connection.shutdown()
        await asyncio.sleep(0.05)  # connections accepted just before the stop get their protocol
        while loop.time() - start < bound_s:
            idle = [c for c in list(self.server_state.connections) if _idle(c)]
            if not idle:  # every connection left closes behind its response
                break
            quiet = time.monotonic() - self._traffic.last_activity >= QUIET_S
            if quiet and not any(_unread(c) for c in idle):
                break
            await asyncio.sleep(0.02)
        return loop.time() - start


class Traffic:
    """ASGI wrapper that notes when requests start and end and, once `draining`, answers
    every request with `Connection: close` (see PlatformServer._quiesce)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.draining = False
        self.last_activity = time.monotonic()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and self.draining:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        self.last_activity = time.monotonic()
        try:
            await self.app(scope, receive, send_closing)
        finally:
            self.last_activity = time.monotonic()


def _idle(connection: object) -> bool:
    cycle = getattr(connection, "cycle", None)
    return cycle is None or bool(getattr(cycle, "response_complete", False))


def _unread(connection: object) -> bool:
    """Whether the connection's socket holds bytes nobody has read yet (FIONREAD)."""
    transport = getattr(connection, "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        pending = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return False
    return int.from_bytes(pending, sys.byteorder, signed=True) > 0


def serve(
    app: object,
    sock: socket.socket,
    *,
    drain_s: float = DEFAULT_DRAIN_S,
    log_level: str = "info",
    timeout_keep_alive: int = 30,
    on_drain: Callable[[], None] | None = None,
    held: list[int] | None = None,
) -> None:
    """Serve `app` on the listening `sock` until a signal; on SIGHUP exec this command line
    again with `sock` handed over (does not return then). `held`: signals `hold_signals`
    recorded during start-up."""
    # uvicorn closes the socket it serves on when it stops accepting; this duplicate keeps
    # the listening socket open (and its backlog filling) until the re-exec hands it over.
    keep = os.dup(sock.fileno())
    traffic = Traffic(app)
    config = uvicorn.Config(
        traffic,
        log_level=log_level,
        timeout_keep_alive=timeout_keep_alive,
        timeout_graceful_shutdown=max(0, round(drain_s)),
        backlog=sockets.BACKLOG,
        lifespan="on",
    )
    held = held if held is not None else hold_signals()
    server = PlatformServer(config, on_drain=on_drain, held=held, traffic=traffic)
    server.run(sockets=[sock])
    if server.restart:
        # From here to the new process's hold_signals, signals wait in the kernel.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        if not any(sig != signal.SIGHUP for sig in held):  # none came after the server let go
            log.warning("sandgym serve: re-executing (pid %d) with the listening socket", os.getpid())
            sockets.reexec(keep)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
    os.close(keep)
