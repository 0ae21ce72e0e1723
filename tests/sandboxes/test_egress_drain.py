"""The egress forwarder's drain (what `sandgym serve` waits for before a restart), with real
sockets: a sandbox's unix socket on one side, a TCP "proxy" on 127.0.0.1 on the other.

A download whose reader is slower than the sender moves no byte while the forwarder waits
for the reader to take what it has; it is still a transfer in progress, not an idle
keep-alive tunnel, and a drain that cut it failed a harness's `pip install` in a sandbox
starved of CPU during a restart."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgym.sandboxes.egress.forwarder import EgressForwarder

PAYLOAD = 8 << 20  # far more than the socket buffers on the way hold


@pytest.fixture
def sender() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that sends PAYLOAD bytes to whoever connects, then closes."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(b"x" * PAYLOAD)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    srv.close()


def test_a_download_waiting_on_its_reader_is_busy_until_read(sender: int, tmp_path: Path) -> None:
    fwd = EgressForwarder(lambda: sender)
    path = tmp_path / "egress.sock"
    fwd.listen(path, "127.0.0.1")
    client = socket.socket(socket.AF_UNIX)
    client.settimeout(60)
    try:
        client.connect(str(path))
        assert client.recv(1) == b"x"  # the transfer is under way; the reader now stalls
        # Nothing moves for far longer than quiet_s while the reader takes nothing.
        assert fwd.drain(timeout_s=1.5, quiet_s=0.2) == 1
        got = 1
        while chunk := client.recv(1 << 20):
            got += len(chunk)
        assert got == PAYLOAD
        assert fwd.drain(timeout_s=30, quiet_s=0.2) == 0  # read to the end: nothing left to wait for
    finally:
        client.close()
        fwd.shutdown()
