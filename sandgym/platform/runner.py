"""`sandgym serve`'s process: uvicorn on a listening socket that outlives the process, with
restarts clients do not notice.

- SIGTERM / SIGINT: **drain**. Stop accepting (the socket stays open in whoever holds it:
  systemd's socket unit, or nobody when we bound it ourselves), let in-flight requests
  finish for up to `drain_s` (every response says `Connection: close` meanwhile), close each
  kept-alive connection once it has been idle for QUIET_S, cut what is still running past
  the bound, detach from the sandboxes (they keep running for the next server on the same
  state) and exit 0. Live-process streams are ended at once: the SDK re-attaches to the
  process (its `Connect`), which the next server serves.
- SIGHUP: **re-exec in place**. Stop accepting, let in-flight requests finish (as above),
  then exec the same command line again (same pid, so systemd's main pid stays), handing
  over the listening socket as fd 3 and every kept-alive connection, between two requests,
  after it (sockets.py): no connection is closed, so no client can race a close. New
  connections wait in the kernel's backlog, and next requests on handed-over connections in
  their socket buffers; the new process re-adopts the sandboxes before it reads either.
- SIGTERM / SIGINT during a SIGHUP's drain turn the re-exec into a stop, until the drain has
  ended holding connections: then the re-exec goes on (closing them would reset the requests
  waiting in them) and the new process stops. SIGHUP during a stop's drain is ignored; a
  second SIGINT cuts the drain short.
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
import resource
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
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from . import sockets

log = logging.getLogger("sandgym.serve")

DEFAULT_DRAIN_S = 20.0  # below prime-sandboxes' 30 s read timeout, which queued requests wait out
QUIET_S = 1.0  # a stop closes a kept-alive connection once idle this long: its client has moved off it
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


class Connection(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol that knows whether it stands between two requests with
    nothing of the next one read (so it can be handed to the next process whole), and since
    when it has been idle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parsing = False  # bytes of a request read, its end not yet
        self.idle_since = time.monotonic()
        self.hold = False  # stop reading as soon as it is between two requests (a re-exec)
        self.paused = False  # reading stopped between two requests

    def on_message_begin(self) -> None:
        self.parsing = True
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self.parsing = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = time.monotonic()
        if self.hold:  # in the same step as the response's last byte: nothing of the next request is read yet
            self.stop_reading()

    def between_requests(self) -> bool:
        cycle = self.cycle
        return (cycle is None or cycle.response_complete) and not self.pipeline and not self.parsing

    def stop_reading(self) -> None:
        """Stop reading if between two requests: what the client sends next stays in the
        socket's buffer for whoever holds the socket next."""
        if self.paused or not self.between_requests() or self.transport.is_closing():
            return
        self.flow.pause_reading()
        self._unset_keepalive_if_required()
        self.paused = True

    @property
    def held(self) -> bool:
        """Ready to be handed over: paused between two requests, the last response's bytes
        all sent (a response cut short would be followed by the next process's answer)."""
        return self.paused and not self.transport.is_closing() and self.transport.get_write_buffer_size() == 0

    def read_again(self) -> None:
        self.hold = False
        if self.paused:
            self.paused = False
            self.flow.resume_reading()

    def adopted(self) -> None:
        """Handed over by the process before: idle as far as this process knows."""
        if self.between_requests() and self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def fileno(self) -> int:
        sock = self.transport.get_extra_info("socket")
        return int(sock.fileno()) if sock is not None else -1


class PlatformServer(uvicorn.Server):
    """uvicorn.Server with the signals above; `run_forever` re-execs on SIGHUP."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_drain: Callable[[], None] | None = None,
        held: list[int] | None = None,
        traffic: Traffic | None = None,
        adopt: list[socket.socket] | None = None,
    ) -> None:
        super().__init__(config)
        self._traffic = traffic
        self.restart = False
        self.signal_name: str | None = None
        self._on_drain = on_drain
        self._held = held if held is not None else []
        self._adopt = adopt or []
        self.handed: list[int] = []  # duplicates of the connections a re-exec hands over
        self.handing = False  # the drain ended holding connections: they go to the new process
        self.then_stop: list[int] = []  # stop signals that came since: the new process obeys them

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
        if self.handing and sig != signal.SIGHUP:
            # Closing the connections now would reset the requests waiting unread in them: the
            # re-exec goes on and the new process, which serves them, stops.
            log.warning("sandgym serve: %s once the connections were to be handed over: the new process stops", name)
            self.then_stop.append(sig)
            return
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

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        loop = asyncio.get_running_loop()
        adopted = 0
        for sock in self._adopt:
            try:
                _, protocol = await loop.connect_accepted_socket(self._connection, sock)
            except OSError as exc:  # its client has gone meanwhile
                log.info("sandgym serve: a handed-over connection is gone: %s", exc)
                continue
            if isinstance(protocol, Connection):
                protocol.adopted()
            adopted += 1
        if self._adopt:
            log.warning("sandgym serve: serving %d connection(s) the previous process handed over", adopted)
        self._adopt = []

    def _connection(self) -> Connection:
        return Connection(config=self.config, server_state=self.server_state, app_state=self.lifespan.state)

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
        bound = self.config.timeout_graceful_shutdown
        bound_s = float(bound) if bound is not None else DEFAULT_DRAIN_S
        spent = await self._drain(bound_s)
        if bound is not None:
            self.config.timeout_graceful_shutdown = max(0, math.ceil(bound - spent))
        await super().shutdown(sockets=sockets)

    def _connections(self) -> list[Connection]:
        return [c for c in list(self.server_state.connections) if isinstance(c, Connection)]

    @staticmethod
    def _hold(connections: list[Connection]) -> None:
        """A re-exec: each connection stops being read once between two requests."""
        for connection in connections:
            connection.hold = True
            connection.stop_reading()

    def _stop_holding(self) -> None:
        """A stop: responses say `Connection: close`, and held connections are read again."""
        if self._traffic is not None:
            self._traffic.draining = True
        for connection in self._connections():
            connection.read_again()

    async def _drain(self, bound_s: float) -> float:
        """Before uvicorn's own shutdown (which closes every idle connection at once and cuts
        what still runs), at most `bound_s`; returns the time spent.

        uvicorn would close kept-alive connections while their clients may be sending the
        next request on them: that request is reset, and the SDK does not retry an exec. So
        a re-exec hands every connection over between two requests (`Connection.hold`), and
        a stop closes a connection only once it has been idle for QUIET_S with nothing unread
        (a client moves off the others itself: every response says `Connection: close`)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        holding = self.restart
        if holding:
            self._hold(self._connections())
        else:
            self._stop_holding()
        await asyncio.sleep(0.05)  # connections accepted just before the stop get their protocol
        while loop.time() - start < bound_s and not self.force_exit:
            if holding and not self.restart:  # SIGTERM during the re-exec's drain: a stop
                holding = False
                self._stop_holding()
            connections = self._connections()
            if holding:
                self._hold(connections)  # also those accepted since
                if all(c.held or c.transport.is_closing() for c in connections):
                    break
            else:
                now = time.monotonic()
                for connection in connections:
                    if connection.between_requests() and now - connection.idle_since >= QUIET_S and not _unread(connection):
                        connection.transport.close()
                if not connections:
                    break
            await asyncio.sleep(0.02)
        if holding:
            self.handing = True
            if not self.restart and self.signal_name is not None:  # a stop came as the loop ended
                self.then_stop.append(int(signal.Signals[self.signal_name]))
                self.restart = True
            held = [c for c in self._connections() if c.held and c.fileno() >= 0]
            log.warning("sandgym serve: handing %d kept-alive connection(s) to the new process", len(held))
            room = _handover_room()
            if len(held) > room:
                log.warning("sandgym serve: %d kept-alive connections, room for %d in the new process: "
                            "the others are closed", len(held), room)
            for connection in held[:room]:
                try:
                    self.handed.append(os.dup(connection.fileno()))  # outlives uvicorn's close of the transport
                except OSError as exc:  # out of descriptors: the rest are closed
                    log.warning("sandgym serve: cannot hand a connection over: %s", exc)
                    break
        return loop.time() - start


class Traffic:
    """ASGI wrapper that, once `draining` (a stop), answers every request with
    `Connection: close`, so clients move off their kept-alive connections themselves."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.draining = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and self.draining:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


def _handover_room() -> int:
    """How many connections a re-exec may hand over: each costs two descriptors until the
    exec (and one after), within the soft limit, leaving the new process room to start."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(0, (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 2 - 128)


def _unread(connection: Connection) -> bool:
    """Whether the connection's socket holds bytes nobody has read yet (FIONREAD)."""
    fd = connection.fileno()
    if fd < 0:
        return False
    try:
        pending = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
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
    connections: list[socket.socket] | None = None,
) -> None:
    """Serve `app` on the listening `sock` until a signal; on SIGHUP exec this command line
    again with `sock` and the kept-alive connections handed over (does not return then).
    `held`: signals `hold_signals` recorded during start-up; `connections`: those the
    process before handed over (sockets.inherited_sockets)."""
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
        http=Connection,
    )
    held = held if held is not None else hold_signals()
    server = PlatformServer(config, on_drain=on_drain, held=held, traffic=traffic, adopt=connections)
    server.run(sockets=[sock])
    if server.restart:
        # From here to the new process's hold_signals, signals wait in the kernel.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        stops = server.then_stop + [sig for sig in held if sig != signal.SIGHUP]  # came after the server let go
        if server.handed or not stops:
            for sig in stops:  # blocked, so pending across the exec: the new process stops
                os.kill(os.getpid(), sig)
            log.warning("sandgym serve: re-executing (pid %d) with the listening socket and %d connection(s)",
                        os.getpid(), len(server.handed))
            try:
                sockets.reexec(keep, server.handed)
            except sockets.HandOverError as exc:  # out of descriptors: the socket alone, then
                log.warning("sandgym serve: cannot hand the connections over (%s): re-executing without them", exc)
                for fd in server.handed:
                    os.close(fd)
                server.handed = []
                sockets.reexec(keep)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
    for fd in server.handed:  # a stop after all: these clients reconnect
        os.close(fd)
    os.close(keep)
