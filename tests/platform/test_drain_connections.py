"""What a drain does to kept-alive connections (sandgym/platform/runner.py), on a real
`runner.serve` process with a tiny streaming app: a response that started before SIGTERM
(so without `Connection: close`) ends its connection right behind its last byte, while the
drain still waits for another request. Left open, such a connection turned idle just as its
client sent the next request, and the drain's later close of it reset that request: the SDK
raised `Connection reset by peer` on an exec after a re-exec in CI."""

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
    import asyncio, socket, sys
    from pathlib import Path
    from sandgym.platform import runner

    gates = Path(sys.argv[1])
    # Idle connections are closed after the drain's quiet time or the keep-alive timeout;
    # long ones leave the close behind the response as the only way a connection can end.
    runner.QUIET_S = 3600.0

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        name = scope["path"].strip("/")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"started\\n", "more_body": True})
        while not (gates / name).exists():  # the test opens the gate
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"done\\n", "more_body": False})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    print(sock.getsockname()[1], flush=True)
    runner.serve(app, sock, drain_s=120, timeout_keep_alive=3600, log_level="warning")
    """
)


def _read_until(conn: socket.socket, marker: bytes, got: bytes = b"") -> bytes:
    while marker not in got:
        chunk = conn.recv(65536)
        assert chunk, f"closed before {marker!r}: {got!r}"
        got += chunk
    return got


def _request(port: int, name: str) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.sendall(f"GET /{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = _read_until(conn, b"started\n")
    assert b"connection: close" not in head.lower(), head  # started before the drain
    return conn


def test_a_response_in_flight_at_the_drain_ends_its_connection(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", APP, str(gates)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=serve_env())
    try:
        assert proc.stdout is not None and proc.stderr is not None
        port = int(proc.stdout.readline())
        first, second = _request(port, "first"), _request(port, "second")
        proc.send_signal(signal.SIGTERM)
        # The log line comes from the same synchronous step that marks busy connections.
        for line in proc.stderr:
            if "draining in-flight requests" in line:
                break
        (gates / "first").touch()
        body = _read_until(first, b"0\r\n\r\n")  # the chunked response's end
        assert b"done\n" in body
        # The connection is closed right behind it: EOF, though the drain goes on for `second`.
        assert first.recv(1) == b"", "the connection stayed open after its response"
        assert proc.poll() is None, "the drain did not wait for the second request"
        (gates / "second").touch()
        assert b"done\n" in _read_until(second, b"0\r\n\r\n")
        assert second.recv(1) == b""
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
