"""What a drain does to kept-alive connections (sandgym/platform/runner.py), on a real
`runner.serve` process with a tiny streaming app, driven over raw sockets:

- a re-exec (SIGHUP) closes none of them: one idle at the signal and one whose response was
  under way both carry their next requests to the new process, and stay open after (as many
  as the descriptor limit leaves room for; the rest are closed and the re-exec goes through);
- a stop (SIGTERM) answers a next request on either with `Connection: close` and closes an
  idle one only once it has been idle for a while, then exits 0.

Closing a connection while its client sends the next request on it resets that request
(the SDK raised `Connection reset by peer` on an exec after a re-exec in CI). Also: a stop
signal once the connections are being handed over (the new process obeys it), a response
still being sent, the descriptor limit, and how passed sockets are told apart by name."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from .procs import serve_env

APP = textwrap.dedent(
    """
    import asyncio, resource, socket, sys, uuid
    from pathlib import Path
    from sandgym.platform import runner, sockets

    gates = Path(sys.argv[1])
    runner.QUIET_S = float(sys.argv[2])
    if len(sys.argv) > 3:  # a descriptor limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    generation = uuid.uuid4().hex[:8].encode()  # a new one after each re-exec

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                if kind == "lifespan.shutdown" and (gates / "hold-shutdown").exists():
                    while not (gates / "shutdown").exists():  # the test opens the gate
                        await asyncio.sleep(0.01)
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        name = scope["path"].strip("/")
        if name == "big":  # 8 MiB in one piece: more than the socket buffers hold
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"8388608")]})
            await send({"type": "http.response.body", "body": b"b" * 8388608})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"started " + generation + b"\\n", "more_body": True})
        while not (gates / name).exists():  # the test opens the gate
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"done\\n", "more_body": False})

    sock, connections = sockets.inherited_sockets()
    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        print(sock.getsockname()[1], flush=True)
    runner.serve(app, sock, drain_s=120, timeout_keep_alive=3600, log_level="warning", connections=connections)
    """
)


class Served:
    def __init__(self, tmp_path: Path, quiet_s: float, *extra: str) -> None:
        self.gates = tmp_path / "gates"
        self.gates.mkdir()
        self.proc = subprocess.Popen([sys.executable, "-c", APP, str(self.gates), str(quiet_s), *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=serve_env())
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.port = int(self.proc.stdout.readline())

    def open(self, name: str) -> None:
        (self.gates / name).touch()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=60)

    def signal(self, sig: int, then: str = "draining in-flight requests") -> None:
        """Send `sig` and wait for the log line `then` (by default the drain's first step,
        which marks the connections in the same step)."""
        self.proc.send_signal(sig)
        self.wait_log(then)

    def wait_log(self, text: str) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if text in line:
                return
        raise AssertionError(f"no {text!r} in the log")

    def stop(self) -> int:
        """SIGTERM; the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _read_until(conn: socket.socket, marker: bytes, got: bytes = b"") -> bytes:
    while marker not in got:
        chunk = conn.recv(65536)
        assert chunk, f"closed before {marker!r}: {got!r}"
        got += chunk
    return got


def _send(conn: socket.socket, name: str) -> None:
    conn.sendall(f"GET /{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def _started(conn: socket.socket) -> tuple[bytes, bytes]:
    """(head, generation) of a response, read up to its first chunk."""
    got = _read_until(conn, b"\nstarted ")
    got = _read_until(conn, b"\r\n", got.split(b"\nstarted ", 1)[1])
    return got.split(b"\r\n\r\n")[0].lower(), got.split(b"\n", 1)[0].strip()


def _finished(conn: socket.socket) -> bytes:
    body = _read_until(conn, b"0\r\n\r\n")  # the chunked response's end
    assert b"done\n" in body
    return body


def _answer(conn: socket.socket, name: str) -> tuple[bytes, bytes]:
    """Send a request whose gate is open; (head, generation) once its response has ended."""
    _send(conn, name)
    got = _read_until(conn, b"0\r\n\r\n")
    head = got.split(b"\r\n\r\n")[0].lower()
    generation = got.split(b"started ", 1)[1].split(b"\n", 1)[0].strip()
    return head, generation


def test_a_reexec_hands_every_kept_alive_connection_to_the_new_process(tmp_path: Path) -> None:
    with Served(tmp_path, quiet_s=1.0) as served:
        served.open("quick")
        idle, busy = served.connect(), served.connect()
        _, first = _answer(idle, "quick")
        _send(busy, "slow")
        head, generation = _started(busy)
        assert generation == first and b"connection: close" not in head
        served.signal(signal.SIGHUP)
        # Sent on the idle connection during the drain: it waits in the socket's buffer.
        _send(idle, "quick")
        served.open("slow")  # the response under way ends in the old process, without a close
        _finished(busy)
        head, after = _answer(busy, "quick")
        assert after != first and b"connection: close" not in head, (head, after)
        got = _read_until(idle, b"0\r\n\r\n")
        assert b"started " + after in got and b"connection: close" not in got.lower(), got
        assert _answer(served.connect(), "quick")[1] == after  # a new connection, from the backlog
        for conn in (idle, busy):  # still open, and kept alive by the new process
            head, generation = _answer(conn, "quick")
            assert generation == after and b"connection: close" not in head
        assert served.stop() == 0


def test_a_response_still_being_sent_is_sent_whole_before_its_connection_is_handed_over(tmp_path: Path) -> None:
    """The app has written all of a big response, most of it still in the old process's
    buffers while the client is slow to read: the client gets all of it, then the new
    process's answer on the same connection (the drain hands a connection over only once its
    last byte is sent)."""
    with Served(tmp_path, 1.0) as served:
        served.open("quick")
        conn = served.connect()
        _, first = _answer(conn, "quick")
        _send(conn, "big")
        head = _read_until(conn, b"\r\n\r\n")  # and nothing more for now
        served.signal(signal.SIGHUP)
        body = head.split(b"\r\n\r\n", 1)[1]
        while len(body) < 8388608:
            chunk = conn.recv(1 << 20)
            assert chunk, f"the response was cut at {len(body)} bytes"
            body += chunk
        assert body == b"b" * 8388608
        assert _answer(conn, "quick")[1] not in (first, b"")  # the new process, on the same connection
        assert served.stop() == 0


def test_a_stop_once_the_connections_are_being_handed_over_is_obeyed_by_the_new_process(tmp_path: Path) -> None:
    """SIGTERM after the re-exec's drain has decided to hand the connections over: closing
    them would reset what their clients sent meanwhile, so the re-exec goes on, the new
    process answers that request (with `Connection: close`) and stops."""
    with Served(tmp_path, 1.0) as served:
        served.open("quick")
        (served.gates / "hold-shutdown").touch()  # the old process's shutdown waits for the test
        conn = served.connect()
        _, first = _answer(conn, "quick")
        served.signal(signal.SIGHUP, then="handing 1 kept-alive connection(s)")
        _send(conn, "quick")  # waits unread in the held connection
        served.proc.send_signal(signal.SIGTERM)
        served.wait_log("the new process stops")
        (served.gates / "shutdown").touch()
        got = _read_until(conn, b"0\r\n\r\n")
        assert b"connection: close" in got.lower() and b"started " + first not in got, got
        assert conn.recv(1) == b""
        assert served.proc.wait(60) == 0


def test_a_reexec_hands_over_what_the_descriptor_limit_leaves_room_for(tmp_path: Path) -> None:
    """300 descriptors leave room for 300 // 2 - 128 = 22 connections: of 30 kept alive, 22
    go on in the new process and 8 are closed; the re-exec itself goes through."""
    with Served(tmp_path, 1.0, "300") as served:
        served.open("quick")
        conns = [served.connect() for _ in range(30)]
        first = {_answer(c, "quick")[1] for c in conns}
        served.signal(signal.SIGHUP)
        after = _answer(served.connect(), "quick")[1]  # from the backlog, once the new process serves
        assert after not in first
        kept = closed = 0
        for conn in conns:
            try:
                _send(conn, "quick")
                got = conn.recv(65536)
            except ConnectionError:
                got = b""
            if got:
                kept += 1
                assert b"started " + after in _read_until(conn, b"0\r\n\r\n", got)
            else:
                closed += 1
        assert (kept, closed) == (22, 8)
        assert served.stop() == 0


def test_a_stop_closes_a_kept_alive_connection_only_behind_a_response_or_once_idle(tmp_path: Path) -> None:
    # Idle connections are closed only after the drain's quiet time (an hour here): until
    # then their next requests are answered, with `Connection: close`.
    with Served(tmp_path, quiet_s=3600.0) as served:
        served.open("quick")
        idle, busy = served.connect(), served.connect()
        _, first = _answer(idle, "quick")
        _send(busy, "slow")
        _started(busy)
        served.signal(signal.SIGTERM)
        served.open("slow")
        _finished(busy)  # its head said nothing of a close: the connection stays usable
        for conn in (busy, idle):
            head, generation = _answer(conn, "quick")
            assert generation == first and b"connection: close" in head, head
            assert conn.recv(1) == b""  # closed right behind that response
        # No connection left: the drain ends long before its bound (120 s).
        assert served.proc.wait(60) == 0


def test_a_stop_closes_connections_once_idle_for_its_quiet_time(tmp_path: Path) -> None:
    with Served(tmp_path, quiet_s=0.5) as served:
        served.open("quick")
        idle = served.connect()
        _answer(idle, "quick")
        served.signal(signal.SIGTERM)
        assert idle.recv(1) == b""
        assert served.proc.wait(60) == 0


CHILD = textwrap.dedent(
    """
    import os, sys
    from sandgym.platform import sockets

    for target, fd in enumerate(map(int, sys.argv[1].split(",")), start=3):
        os.dup2(fd, target)
    os.environ.update(LISTEN_FDS=sys.argv[2], LISTEN_FDNAMES=sys.argv[3], LISTEN_PID=str(os.getpid()))
    try:
        listener, connections = sockets.inherited_sockets()
    except sockets.ActivationError as exc:
        print("ActivationError:", exc)
    else:
        print(listener is not None, len(connections))
    """
)


def test_passed_sockets_are_told_apart_by_name() -> None:
    """A re-exec's listener and connections; systemd's socket unit (the listener under the
    unit's name, or no names); and systemd's `Accept=yes` (one connected socket, named
    `connection`), which is refused: a server needs a listener."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(4)
    a, b = socket.socketpair()
    try:
        def child(fds: list[socket.socket], names: str) -> str:
            nums = [s.fileno() for s in fds]
            out = subprocess.run([sys.executable, "-c", CHILD, ",".join(map(str, nums)), str(len(nums)), names],
                                 pass_fds=nums, capture_output=True, text=True, env=serve_env(), timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout.strip()

        assert child([listening, a], "http:sandgym-connection") == "True 1"
        assert child([listening], "sandgym-serve.socket") == "True 0"
        assert child([listening], "") == "True 0"
        assert child([a], "connection").startswith("ActivationError")
        assert child([a], "sandgym-connection").startswith("ActivationError")  # connections without a listener
    finally:
        for sock in (listening, a, b):
            sock.close()
