"""`sandgym serve` as a real child process (restartable), for tests that stop and start it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
from prime_sandboxes import APIClient, SandboxClient

from .conftest import backend


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker_containers(*labels: str) -> list[str]:
    """Ids of containers carrying all `labels` (key=value)."""
    filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
    out = subprocess.run(["docker", "ps", "-aq", *filters], capture_output=True, text=True)
    return out.stdout.split()


class ServeProcess:
    """`python -m sandgym serve` as a child process on a free port."""

    def __init__(self, *args: str, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandgym", "serve", "--port", str(self.port), "--provider", backend(),
             "--log-level", "warning", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for _ in range(600):
            try:
                if httpx.get(f"{self.url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(self.proc.stdout.read() if self.proc.stdout else "serve exited")
            time.sleep(0.1)
        raise AssertionError("sandgym serve did not come up")

    def client(self, token: str) -> SandboxClient:
        api = APIClient(api_key=token)
        api.base_url = self.url  # the SDK's public attribute; no env needed
        return SandboxClient(api)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(60)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
