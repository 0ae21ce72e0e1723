"""ownership.py: which sandboxes count as orphaned (what every reaper removes), the labels
and grace a manager stamps, and the owner's end of a lifeline (fork children drop it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from sandgym.sandboxes import SandboxManager, SandboxSpec, prune
from sandgym.sandboxes.ownership import (
    LABEL_ORPHAN_GRACE,
    LABEL_OWNER_KIND,
    LABEL_PID_START,
    Lifeline,
    lifeline_grace_s,
    orphaned,
    owner_labels,
    process_start_time,
)
from sandgym.sandboxes.providers.local import LocalProvider
from sandgym.sandboxes.spec import LABEL_HOST, LABEL_OWNER, LABEL_PID

HOST = socket.gethostname()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def root() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="sandgym-ownership-")
    os.chmod(d, 0o711)
    yield d
    p = LocalProvider(d)
    for info in p._list_sync({}):
        p._remove_sync(info.id)
    shutil.rmtree(d, ignore_errors=True)


def test_orphaned_only_when_this_host_can_tell_the_owner_is_gone(dead_pid: int) -> None:
    me = {LABEL_HOST: HOST, LABEL_PID: str(os.getpid()), LABEL_PID_START: process_start_time(os.getpid()) or ""}
    assert not orphaned(me)
    assert orphaned({LABEL_HOST: HOST, LABEL_PID: str(dead_pid)})
    # Our pid recycled: the start time says the owner is another process.
    assert orphaned({**me, LABEL_PID_START: "1"})
    # Another host's, a platform's, or one whose owner we cannot name: never ours to judge.
    assert not orphaned({LABEL_HOST: "another-host", LABEL_PID: str(dead_pid)})
    assert not orphaned({LABEL_HOST: HOST, LABEL_PID: str(dead_pid), LABEL_OWNER_KIND: "platform"})
    assert not orphaned({LABEL_HOST: HOST, LABEL_PID: str(dead_pid), LABEL_OWNER_KIND: "something-else"})
    assert not orphaned({LABEL_HOST: HOST})
    assert not orphaned({LABEL_PID: str(dead_pid)})


def test_owner_labels_and_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDGYM_ORPHAN_GRACE_S", raising=False)
    labels = owner_labels("r1")
    assert labels[LABEL_OWNER_KIND] == "process" and lifeline_grace_s(labels) == 0.0
    assert lifeline_grace_s(owner_labels("r1", orphan_grace_s=7.5)) == 7.5
    monkeypatch.setenv("SANDGYM_ORPHAN_GRACE_S", "30")
    assert owner_labels("r1")[LABEL_ORPHAN_GRACE] == "30"
    assert SandboxManager("local").labels[LABEL_ORPHAN_GRACE] == "30"
    platform = SandboxManager("local", owner_kind="platform").labels
    assert platform[LABEL_OWNER_KIND] == "platform" and LABEL_ORPHAN_GRACE not in platform
    assert lifeline_grace_s(platform) is None  # no lifeline: only its TTL ends it
    monkeypatch.setenv("SANDGYM_ORPHAN_GRACE_S", "soon")
    with pytest.raises(ValueError, match="SANDGYM_ORPHAN_GRACE_S"):
        owner_labels("r1")
    with pytest.raises(ValueError, match="orphan_grace_s"):
        owner_labels("r1", orphan_grace_s=-1)


def test_lifeline_end_is_dropped_by_fork_children_and_closed_once() -> None:
    ours, r = Lifeline.pipe()
    pid = os.fork()
    if pid == 0:  # the child must not hold the owner's end
        try:
            os.fstat(ours.fd)
            os._exit(1)
        except OSError:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    os.set_blocking(r, False)
    with pytest.raises(BlockingIOError):
        os.read(r, 1)  # a writer is left: no end-of-file
    ours.close()
    assert os.read(r, 1) == b""  # the owner's end closed: the watcher sees end-of-file
    os.close(r)
    # A second close() of a lifeline must not close whatever reuses its fd number.
    other, r2 = Lifeline.pipe()
    ours.close()
    os.fstat(other.fd)
    other.close()
    os.close(r2)


def test_lifeline_fifo(tmp_path) -> None:
    ours = Lifeline.fifo(tmp_path / "lifeline")
    assert oct((tmp_path / "lifeline").stat().st_mode & 0o777) == "0o644"
    fd = os.open(tmp_path / "lifeline", os.O_RDONLY | os.O_NONBLOCK)
    with pytest.raises(BlockingIOError):
        os.read(fd, 1)
    ours.close()
    assert os.read(fd, 1) == b""
    os.close(fd)


@pytest.mark.anyio
async def test_prune_removes_only_this_hosts_dead_process_owners(root: str, dead_pid: int) -> None:
    p = LocalProvider(root)
    spec = SandboxSpec(memory_mb=128, disk_mb=16)
    dead = await p.create(spec, {LABEL_OWNER: "t", LABEL_PID: str(dead_pid)})
    elsewhere = await p.create(spec, {LABEL_OWNER: "t", LABEL_PID: str(dead_pid), LABEL_HOST: "another-host"})
    platform = await p.create(spec, {LABEL_OWNER: "t", LABEL_PID: str(dead_pid), LABEL_OWNER_KIND: "platform"})
    alive = await p.create(spec, {LABEL_OWNER: "t"})  # stamped with this process as owner
    try:
        report = await prune(p)
        assert report.removed == [dead.id] and not report.failed
        assert set(report.kept) == {elsewhere.id, platform.id, alive.id}
        assert (await alive.exec("echo ok")).stdout == "ok\n"
        again = await prune(p)  # idempotent
        assert again.removed == [] and not again.failed
        everything = await prune(p, everything=True)
        assert set(everything.removed) == {elsewhere.id, platform.id, alive.id}
    finally:
        for sb in (dead, elsewhere, platform, alive):
            await sb.close()
