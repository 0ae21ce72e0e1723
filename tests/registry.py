"""A real registry on 127.0.0.1 for tests: Debian's docker-registry (distribution 2.8),
started as a child process, stopped and its storage deleted afterwards. The engine treats
127.0.0.0/8 registries as insecure (plain HTTP) by default, so pushes and pulls just work."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import require


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_registry(d: Path, *, htpasswd: Path | None = None, storage: Path | None = None) -> Iterator[str]:
    """Serve a registry with its storage under `d` (or in `storage`, which the caller owns and
    may share between registries); yields `127.0.0.1:PORT`. With `htpasswd`, pulls and pushes
    need those credentials."""
    require("registry")
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = [
        "version: 0.1",
        "log: {level: warn}",
        f"storage: {{filesystem: {{rootdirectory: {storage or d / 'data'}}}, delete: {{enabled: true}}}}",
        f"http: {{addr: 127.0.0.1:{port}}}",
    ]
    if htpasswd is not None:
        conf.append(f"auth: {{htpasswd: {{realm: sandgym-test, path: {htpasswd}}}}}")
    (d / "config.yml").write_text("\n".join(conf) + "\n")
    with open(d / "registry.log", "wb") as err:
        proc = subprocess.Popen(["docker-registry", "serve", str(d / "config.yml")], stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).close()
                break
            except urllib.error.HTTPError as e:
                if e.code == 401:  # up, and asking for credentials
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"docker-registry did not start: {(d / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(d / "data", ignore_errors=True)  # pushed layers: hundreds of MB
