"""The in-sandbox end of egress: TCP 127.0.0.1:PORT -> the host's egress unix socket.

Standard library only (runs inside the sandbox; daemon.py loads it by path when started with
--egress-port and --egress-socket). A sandbox has no network interface but loopback, so
programs are pointed at http://127.0.0.1:PORT by HTTP(S)_PROXY; each connection they open
is carried over a fresh connection to the bind-mounted unix socket, whose host end forwards
it to the egress proxy. Nothing here decides anything: the policy is enforced on the host.
One thread per connection moves both directions (selectors), to stay light on the pids limit.

The host end lives in the server that made the sandbox; while that server restarts (and
re-adopts the sandbox) nothing listens on the socket, so a new connection waits and tries
again for up to RECONNECT_S instead of failing: programs in the sandbox see a slow connect,
not a refusal. (Connections open at the restart end with the old server.)
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

CHUNK = 1 << 16
RECONNECT_S = 60.0  # longer than a server's drain and restart


def _carry(a: socket.socket, b: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    peers = {a: b, b: a}
    by_fd = {a.fileno(): a, b.fileno(): b}
    open_in = {a, b}
    try:
        for s in open_in:
            sel.register(s, selectors.EVENT_READ)
        while open_in:
            for key, _ in sel.select():
                src = by_fd[key.fd]
                dst = peers[src]
                try:
                    data = src.recv(CHUNK)
                except OSError:
                    data = b""
                if data:
                    try:
                        dst.sendall(data)
                        continue
                    except OSError:
                        return
                sel.unregister(src)
                open_in.discard(src)
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
    finally:
        sel.close()
        a.close()
        b.close()


def _connect(uds_path: str) -> socket.socket:
    """A connection to the host end, waiting out a restart of its server (no listener yet)."""
    deadline = time.monotonic() + RECONNECT_S
    delay = 0.05
    while True:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(uds_path)
            return up
        except (ConnectionRefusedError, FileNotFoundError):
            up.close()
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except OSError:
            up.close()
            raise


def _handle(client: socket.socket, uds_path: str) -> None:
    try:
        up = _connect(uds_path)
    except OSError as exc:
        msg = ("sandgym egress relay: the host side is unreachable (%s)\n" % exc).encode()
        try:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg))
        except OSError:
            pass
        client.close()
        return
    _carry(client, up)


def start(port: int, uds_path: str) -> threading.Thread:
    """Listen on 127.0.0.1:`port` and relay each connection to `uds_path`, in a daemon thread."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(128)

    def accept_loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            try:
                threading.Thread(target=_handle, args=(conn, uds_path), daemon=True).start()
            except RuntimeError:  # no thread to be had (pids limit): refuse this one
                conn.close()

    t = threading.Thread(target=accept_loop, name="egress-relay", daemon=True)
    t.start()
    return t
