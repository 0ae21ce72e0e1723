"""Host-side witnesses for the hostile corpus: a marker process, loopback listeners and a
secret file on the host, all of which must come through every hostile program unharmed and
unreached. Plus helpers to look for a sandbox's leftovers on the host."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class HostWitness:
    marker: str  # argv[0] of a host process that must stay alive and invisible to sandboxes
    proc: subprocess.Popen[bytes]
    secret: str
    secret_path: Path
    tcp: socket.socket
    udp: socket.socket
    heard: list[bytes] = field(default_factory=list)  # everything the listeners received
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def tcp_port(self) -> int:
        return int(self.tcp.getsockname()[1])

    @property
    def udp_port(self) -> int:
        return int(self.udp.getsockname()[1])

    def serve(self) -> None:
        self.tcp.settimeout(0.2)
        self.udp.settimeout(0.0)
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except TimeoutError:
                pass
            except OSError:
                return
            else:
                with conn:
                    conn.settimeout(1)
                    try:
                        self.heard.append(b"tcp:" + conn.recv(256))
                    except OSError:
                        self.heard.append(b"tcp:")
            try:
                while True:
                    self.heard.append(b"udp:" + self.udp.recv(256))
            except (BlockingIOError, OSError):
                pass

    def host_probe(self) -> None:
        """The listener still works for the host itself (the host is unaffected)."""
        with socket.create_connection(("127.0.0.1", self.tcp_port), timeout=5) as s:
            s.sendall(b"host-probe")
        deadline = time.monotonic() + 5
        while b"tcp:host-probe" not in self.heard and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b"tcp:host-probe" in self.heard, "the host listener stopped answering"
        self.heard.remove(b"tcp:host-probe")

    def assert_unaffected(self) -> None:
        assert self.proc.poll() is None, "the host marker process died"
        self.host_probe()
        assert self.heard == [], f"a sandbox reached a host listener: {self.heard!r}"
        assert self.secret_path.read_text() == self.secret


@pytest.fixture(scope="session")
def host_witness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostWitness]:
    marker = "sandgym-host-witness-" + secrets.token_hex(6)
    proc = subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 100000"])
    d = tmp_path_factory.mktemp("host-secret")
    secret = "host-secret-" + secrets.token_hex(12)
    path = d / "secret.txt"
    path.write_text(secret)
    os.chmod(path, 0o644)  # world-readable on purpose: only isolation may keep it out
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    w = HostWitness(marker, proc, secret, path, tcp, udp)
    t = threading.Thread(target=w.serve, daemon=True)
    t.start()
    try:
        yield w
    finally:
        w._stop.set()
        t.join(5)
        tcp.close()
        udp.close()
        proc.kill()
        proc.wait()


def host_pids_with(marker: str) -> list[int]:
    """Host processes whose command line contains `marker` (sandboxes' processes are host
    processes too: docker and bwrap share the kernel's process table)."""
    needle = marker.encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found
