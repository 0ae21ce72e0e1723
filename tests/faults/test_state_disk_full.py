"""`sandgym serve`'s state directory fills up for real (a small tmpfs, filled by a file until
ENOSPC) in the middle of an SDK workload.

Asserted, through the unmodified SDK: while the disk is full every acknowledged sandbox
answers and takes uploads that read back; a create is refused with 507 and makes no
container; a delete is refused with 507 and the sandbox goes on RUNNING (never half-deleted);
once the space is back the delete works, and after a restart on the same state every
sandbox that was acknowledged and not deleted is RUNNING with its files. Nothing is left
behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prime_sandboxes import APIError, CreateSandboxRequest, SandboxClient

from tests.conftest import lacking, require
from tests.platform.procs import ServeProcess, _docker_containers

TOKEN = "disk-full-token"
IMAGE = "sandgym/python:latest"
N = 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: the state directory fits, a filler file fills it."""
    if os.geteuid() != 0:
        lacking("mounting a small tmpfs for the state directory needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> int:
    """Write `path` until the disk is full; bytes written."""
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            n += os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC
    finally:
        os.close(fd)
    return n


def _create(c: SandboxClient, name: str) -> str:
    sb = c.create(CreateSandboxRequest(name=name, docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
    c.wait_for_creation(sb.id)
    return str(sb.id)


def _read(c: SandboxClient, sid: str, path: str) -> str:
    r = c.execute_command(sid, f"cat {path}")
    assert r.exit_code == 0, (sid, r.stderr)
    return str(r.stdout)


@pytest.mark.docker
def test_state_directory_full(small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require("docker")
    monkeypatch.setenv("HOME", str(tmp_path))  # the SDK's auth cache is the test's own
    state = small_disk / "state"
    label = f"platform.state={state.resolve()}"
    srv = ServeProcess("--token", TOKEN, "--state-dir", str(state), "--max-sandboxes", str(N + 1))
    written: dict[tuple[str, str], str] = {}  # acknowledged writes: (sandbox, path) -> content
    lost: set[str] = set()
    misreported: list[str] = []
    try:
        c = srv.client(TOKEN)
        acked = [_create(c, f"full-{i}") for i in range(N)]
        for sid in acked:
            c.upload_bytes(sid, "/workspace/before.txt", f"before {sid}".encode(), "before.txt")
            written[(sid, "/workspace/before.txt")] = f"before {sid}"
        filled = _fill(small_disk / "filler")

        with pytest.raises(APIError, match="507"):
            c.create(CreateSandboxRequest(name="refused", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
        assert len(_docker_containers(label)) == N, "a refused create made a container"
        with pytest.raises(APIError, match="507"):
            c.delete(acked[0])
        for sid in acked:  # every acknowledged sandbox answers and takes writes
            if c.get(sid).status != "RUNNING":
                misreported.append(f"{sid} is {c.get(sid).status} while the disk was full")
            c.upload_bytes(sid, "/workspace/during.txt", f"during {sid}".encode(), "during.txt")
            written[(sid, "/workspace/during.txt")] = f"during {sid}"
            for (s, path), content in written.items():
                if s == sid and _read(c, sid, path) != content:
                    misreported.append(f"{sid}:{path} read back wrong")

        (small_disk / "filler").unlink()
        c.delete(acked[0])  # room again: now it goes
        assert c.get(acked[0]).status == "TERMINATED"
        kept = acked[1:]
        assert srv.stop(signal.SIGTERM) in (0, -signal.SIGTERM)

        srv = ServeProcess("--token", TOKEN, "--state-dir", str(state), "--max-sandboxes", str(N + 1), port=srv.port)
        c = srv.client(TOKEN)
        for sid in kept:
            status = c.get(sid).status
            if status != "RUNNING":
                lost.add(sid)
                continue
            for (s, path), content in written.items():
                if s == sid and _read(c, sid, path) != content:
                    misreported.append(f"{sid}:{path} read back wrong after the restart")
        writes_lost = sum(1 for (s, _) in written if s in lost)
        print(f"\n[fault] state directory full ({filled} B filler): injected 1, sandboxes lost {len(lost)}, "
              f"writes lost {writes_lost}, misreported {len(misreported)}")
        assert not lost and not misreported, (lost, misreported)
        for sid in kept:
            c.delete(sid)
    finally:
        srv.stop(signal.SIGTERM)
    # The next server on this state would find nothing of ours either.
    for _ in range(60):
        if not _docker_containers(label):
            break
        time.sleep(0.5)
    assert _docker_containers(label) == [], "containers of this state left behind"
