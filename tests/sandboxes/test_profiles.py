"""Isolation profiles and disks on the real Docker engine: strict and vm (gVisor), quotas
that give ENOSPC without spending memory, refusals before anything is made, exit reasons,
and nothing left behind on any path."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from sandgym.sandboxes.base import ExecJob
from sandgym.sandboxes.errors import SandboxCreateError, SandboxGoneError, SpecError
from sandgym.sandboxes.ownership import owner_labels
from sandgym.sandboxes.providers.docker import DockerProvider, DockerSandbox
from sandgym.sandboxes.providers.docker.runtime import DISK_ROOT
from sandgym.sandboxes.spec import SandboxSpec
from tests.conftest import available, lacking, require

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker")]

RUN = uuid.uuid4().hex[:12]
LABELS = {**owner_labels("test-profiles"), "sandgym.run": RUN}
STRICT = SandboxSpec(memory_mb=256, disk_mb=64, pids=128, ttl_s=900)
VM = STRICT.model_copy(update={"profile": "vm"})


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def provider() -> AsyncIterator[DockerProvider]:
    p = DockerProvider()
    try:
        yield p
    finally:
        for info in await p.list({"sandgym.run": RUN}):
            await p.remove(info.id)
        await p.aclose()


@pytest.fixture(scope="module")
def vm_ok(provider: DockerProvider) -> None:
    require("vm")


@pytest.fixture(scope="module")
def loop_ok(provider: DockerProvider) -> None:
    require("disks")
    assert provider.plan(STRICT).disk == "loop", provider.plan(STRICT)


@pytest.fixture
async def made(provider: DockerProvider) -> AsyncIterator[list[DockerSandbox]]:
    boxes: list[DockerSandbox] = []
    try:
        yield boxes
    finally:
        for b in boxes:
            await b.close()


async def _new(provider: DockerProvider, made: list[DockerSandbox], spec: SandboxSpec) -> DockerSandbox:
    sb = await provider.create(spec, LABELS)
    made.append(sb)
    return sb


def _our_disks() -> set[str]:
    try:
        return {e.name for e in os.scandir(DISK_ROOT) if e.name.startswith("sandgym-")}
    except OSError:
        return set()


def _loop_mounts() -> set[str]:
    with open("/proc/mounts") as f:
        return {line.split()[1] for line in f if str(DISK_ROOT) in line.split()[1]}


def _oom_kills(cid: str) -> int:
    for p in (f"/sys/fs/cgroup/memory/docker/{cid}/memory.oom_control", f"/sys/fs/cgroup/docker/{cid}/memory.events"):
        try:
            for line in Path(p).read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except OSError:
            continue
    lacking(f"cannot read the memory cgroup counters of container {cid} here")


_FILL = textwrap.dedent("""\
    import errno, os, sys
    path, mib = sys.argv[1], int(sys.argv[2])
    done = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"x" * (1 << 20)); done += 1
            f.flush(); os.fsync(f.fileno())
        print("wrote", done)
    except OSError as e:
        print("errno", e.errno, "after", done)
    """)


# -- vm: root, a writable root, gVisor ------------------------------------------------------


async def test_vm_is_root_on_gvisor_with_a_writable_root(
    provider: DockerProvider, made: list[DockerSandbox], vm_ok: None
) -> None:
    sb = await _new(provider, made, VM)
    host = provider.api.inspect_container(sb.id)["HostConfig"]
    assert host["Runtime"] == "runsc" and host["ReadonlyRootfs"] is False
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == sorted(
        ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"])
    r = await sb.exec(
        "id -u; uname -r; echo $HOME; ls -la / >/dev/null && echo ls-ok; "
        "echo a > /usr/local/bin/tool && echo b > /work/f && echo c > /app/f && echo d > /etc/x && echo writes-ok; "
        "mkdir -p /opt/new/deep && echo mkdir-ok"
    )
    assert r.stdout.split() == ["0", "4.4.0", "/root", "ls-ok", "writes-ok", "mkdir-ok"], r.stderr
    # Files go through the same root: uploads to /work and /app work (Prime/E2B users expect it).
    await sb.write_file("/work/hello.txt", "hi")
    await sb.write_file("/app/deep/x.txt", "there")
    assert await sb.read_file("/work/hello.txt") == b"hi"
    assert (await sb.exec("cat /app/deep/x.txt")).stdout == "there"
    assert await sb.reset() is False  # a writable root cannot be made like new


async def test_vm_with_a_non_root_user_owns_work_app_and_workdir(
    provider: DockerProvider, made: list[DockerSandbox], vm_ok: None
) -> None:
    sb = await _new(provider, made, VM.model_copy(update={"user": "1000:1000"}))
    r = await sb.exec("id -u; touch /work/a /app/a /workspace/a /tmp/a && echo ok; touch /etc/x 2>/dev/null || echo etc-refused")
    assert r.stdout.split() == ["1000", "ok", "etc-refused"], r.stderr


async def test_vm_root_sees_nothing_of_the_host_or_other_sandboxes(
    provider: DockerProvider, made: list[DockerSandbox], vm_ok: None
) -> None:
    mark = "other" + uuid.uuid4().hex[:8]
    a = await _new(provider, made, VM)
    b = await _new(provider, made, VM)
    await a.exec(f"echo {mark} > /{mark}.txt; (exec -a {mark} sleep 300) >/dev/null 2>&1 &")
    assert mark in (await a.exec("ps -eo args")).stdout  # it runs, in a
    r = await b.exec(  # the mark only in the environment, so no command line of b holds it
        "ps -eo args; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; "
        'ls "/$M.txt" 2>&1; find / -xdev -name "$M*" 2>/dev/null; '
        "ls -la /var/run/docker.sock /run/docker.sock 2>&1; cat /proc/1/cmdline | tr '\\0' ' '",
        env={"M": mark},
    )
    assert mark not in r.stdout.replace(f"ls: cannot access '/{mark}.txt'", ""), r.stdout
    assert r.stdout.count("No such file or directory") >= 3, r.stdout
    # b's own processes only: execd (its init and its serving half), and this command
    assert r.stdout.count("/opt/sandgym-execd/server.py") >= 2, r.stdout
    host_pid = os.getpid()
    r = await b.exec(f"test -e /proc/{host_pid}/root/etc/hostname && cat /proc/{host_pid}/cmdline; echo checked")
    assert "pytest" not in r.stdout and "checked" in r.stdout


async def test_vm_refused_without_gvisor_unless_the_operator_opts_in(caplog: pytest.LogCaptureFixture, vm_ok: None) -> None:
    p = DockerProvider(runtime="runc", allow_vm_without_gvisor=False)
    try:
        with pytest.raises(SpecError, match=r"profile='vm'.*gVisor.*SANDGYM_ALLOW_VM_WITHOUT_GVISOR=1"):
            p.check(VM)
        assert _our_disks() == _our_disks()  # nothing was made by a check
    finally:
        await p.aclose()
    p = DockerProvider(runtime="runc", allow_vm_without_gvisor=True)
    try:
        with caplog.at_level(logging.WARNING):
            sb = await p.create(VM, LABELS)
        try:
            assert any("WITHOUT gVisor" in r.message for r in caplog.records)
            assert p.api.inspect_container(sb.id)["HostConfig"]["Runtime"] == "runc-sandgym"
            r = await sb.exec("id -u; uname -r; echo x > /usr/x && echo writable")
            assert r.stdout.splitlines()[0] == "0" and r.stdout.splitlines()[1] != "4.4.0"
            assert "writable" in r.stdout, r.stderr
        finally:
            await sb.close()
    finally:
        await p.aclose()


# -- disks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["strict", "vm"])
async def test_disk_full_is_enospc_and_spends_no_memory(
    provider: DockerProvider, made: list[DockerSandbox], loop_ok: None, profile: str
) -> None:
    if profile == "vm":
        require("vm")
    # 300 MiB of disk behind 128 MiB of memory: twice the memory limit is written to disk.
    spec = STRICT.model_copy(update={"profile": profile, "memory_mb": 128, "disk_mb": 300})
    sb = await _new(provider, made, spec)
    await sb.write_file("/tmp/fill.py", _FILL)
    r = await sb.exec(["python3", "/tmp/fill.py", "big", "256"], timeout=120)
    assert r.stdout.split() == ["wrote", "256"], (r.stdout, r.stderr)
    r = await sb.exec(["python3", "/tmp/fill.py", "more", "200"], timeout=120)
    assert r.stdout.split()[:2] == ["errno", "28"], r.stdout  # ENOSPC, to the writer
    info = await sb.info()
    assert info.status == "running" and info.error_type == "DISK_FULL", info
    assert info.disk_mb is not None and info.disk_mb >= 300
    assert _oom_kills(sb.id) == 0
    r = await sb.exec("rm -f big more /tmp/more /workspace/more && echo freed && df -m . | tail -1")
    assert "freed" in r.stdout, r.stderr
    assert (await sb.info()).error_type is None


@pytest.mark.slow
async def test_sdk_defaults_write_1400_mb(provider: DockerProvider, made: list[DockerSandbox], vm_ok: None) -> None:
    """Issue 12, item 3: with Prime's SDK defaults (1 GB memory, 5 GB disk) writing 1.4 GB
    must neither kill the sandbox nor leave it RUNNING-but-dead."""
    sb = await _new(provider, made, VM.model_copy(update={"memory_mb": 1024, "disk_mb": 5120}))
    await sb.write_file("/tmp/fill.py", _FILL)
    r = await sb.exec(["python3", "/tmp/fill.py", "/work/big", "1400"], timeout=300)
    assert r.stdout.split() == ["wrote", "1400"], (r.stdout, r.stderr)
    assert (await sb.exec("echo alive")).stdout == "alive\n"
    info = await sb.info()
    assert info.status == "running" and info.error_type is None and (info.disk_used_mb or 0) >= 1400


async def test_bad_disk_and_memory_are_refused_naming_the_range(provider: DockerProvider, loop_ok: None) -> None:
    before = _our_disks()
    with pytest.raises(SpecError, match=r"disk_mb=1048576 .*allowed range: \[1, \d+\]"):
        provider.check(STRICT.model_copy(update={"disk_mb": 1024 * 1024}))
    with pytest.raises(SpecError, match=r"disk_mb=1048576"):
        await provider.create(STRICT.model_copy(update={"disk_mb": 1024 * 1024}), LABELS)
    if available("vm"):
        with pytest.raises(SpecError, match=r"memory_mb=32 .*gVisor.*allowed range: \[64, \d+\]"):
            provider.check(VM.model_copy(update={"memory_mb": 32}))
    p = DockerProvider(disk="tmpfs")  # the old way: the workdir and /tmp cost memory
    try:
        with pytest.raises(SpecError, match=r"disk_mb=200: .*tmpfs.*memory_mb=256; allowed range: \[1, 128\]"):
            p.check(STRICT.model_copy(update={"disk_mb": 200}))
    finally:
        await p.aclose()
    # No disk left by the refused create. Other workers' sandboxes share the disk root: one
    # may be between its disk and its container for a moment; a leak stays.
    stray = _our_disks() - before - _live_names(provider)
    if stray:
        await anyio.sleep(3)
        stray &= _our_disks() - _live_names(provider)
    assert not stray, stray


def _live_names(provider: DockerProvider) -> set[str]:
    return {n.lstrip("/") for c in provider.api.containers(all=True) for n in c.get("Names") or ()}


async def test_failed_start_leaves_nothing_behind(provider: DockerProvider, loop_ok: None, tmp_path: Path) -> None:
    p = DockerProvider(socket_root=tmp_path / "sockets")  # its own socket dirs: others may be creating now
    before_disks = _our_disks()
    try:
        specs = [STRICT] + ([VM] if available("vm") else [])
        for spec in (s.model_copy(update={"user": "nosuchuser"}) for s in specs):
            with pytest.raises(SandboxCreateError, match="nosuchuser"):
                await p.create(spec, LABELS)
    finally:
        await p.aclose()
    # Disks are host-wide (other sandboxes may come and go meanwhile): none without a container.
    stray = _our_disks() - before_disks - _live_names(provider)
    if stray:  # another worker's sandbox may be between its disk and its container
        await anyio.sleep(3)
        stray &= _our_disks() - _live_names(provider)
    assert not stray and not any(n in m for n in stray for m in _loop_mounts())
    assert os.listdir(tmp_path / "sockets") == []
    assert await provider.list({"sandgym.run": RUN}) == []


async def test_ttl_end_removes_the_disk_and_says_timeout(provider: DockerProvider, vm_ok: None) -> None:
    sb = await provider.create(VM.model_copy(update={"ttl_s": 3}), LABELS)
    name = sb.box.name if sb.box else ""
    assert name in _our_disks()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and await anyio.to_thread.run_sync(provider._is_running, sb.id):
        await anyio.sleep(0.5)
    info = await provider.inspect(sb.id, wait_s=10)
    assert info is not None and info.error_type == "TIMEOUT", info
    with pytest.raises(SandboxGoneError) as gone:
        await sb.exec("true")
    assert gone.value.reason == "TIMEOUT"
    # The runtime wrapper unmounted and deleted the disk when the engine removed the container.
    for _ in range(40):
        if name not in _our_disks():
            break
        await anyio.sleep(0.25)
    assert name not in _our_disks() and not any(name in m for m in _loop_mounts())
    await sb.close()


async def test_oom_in_gvisor_is_reported(provider: DockerProvider, vm_ok: None) -> None:
    sb = await provider.create(VM.model_copy(update={"memory_mb": 128}), LABELS)
    try:
        try:
            r = await sb.exec("python3 -c 'x = bytearray(1 << 30); x[::4096] = b\"a\" * len(x[::4096])'", timeout=60)
        except SandboxGoneError as exc:
            assert exc.reason == "OOM_KILLED", exc
            info = await sb.info()
            assert info.status != "running" and info.error_type == "OOM_KILLED", info
        else:  # gVisor refused the memory itself: the program failed, the sandbox lives
            assert r.exit_code != 0 and "MemoryError" in r.stderr, r
            assert (await sb.info()).status == "running"
    finally:
        await sb.close()


async def test_a_killed_driver_leaves_nothing_behind(provider: DockerProvider, vm_ok: None) -> None:
    """A driver SIGKILLed with a vm sandbox with egress: its squid ends with it; the
    container (reaped later, here by hand) takes its disk with it."""
    run = "crash" + uuid.uuid4().hex[:8]
    code = textwrap.dedent(f"""
        import anyio, os, sys
        from sandgym.sandboxes import SandboxSpec, EgressPolicy
        from sandgym.sandboxes.providers.docker import DockerProvider
        async def main():
            p = DockerProvider()
            sb = await p.create(SandboxSpec(profile="vm", memory_mb=256, disk_mb=64,
                                            egress=EgressPolicy(allow=["pypi.org"])), {{"sandgym.owner": "{run}", "sandgym.run": "{run}"}})
            print(sb.id, sb.box.name, flush=True)
            await anyio.sleep(600)
        anyio.run(main)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None
        cid, name = proc.stdout.readline().split()
        squids = subprocess.run(["pgrep", "-f", f"egress/{proc.pid}-"], capture_output=True, text=True).stdout.split()
        assert squids, "the driver's squid runs"
        assert name in _our_disks()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-f", f"egress/{proc.pid}-"], capture_output=True).returncode == 0:
        await anyio.sleep(0.2)
    assert subprocess.run(["pgrep", "-f", f"egress/{proc.pid}-"], capture_output=True).returncode != 0, "squid outlived its driver"
    await provider.remove(cid)  # what prune / the reaper does for a dead owner
    assert name not in _our_disks() and not any(name in m for m in _loop_mounts())


# -- output ---------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["strict", "vm"])
async def test_truncation_is_always_flagged(provider: DockerProvider, made: list[DockerSandbox], profile: str) -> None:
    """Issue 12, item 6: 20 MB of stdout under a 16 MiB cap comes back cut *and flagged*,
    whichever way the command ran."""
    if profile == "vm":
        require("vm")
    spec = STRICT.model_copy(update={"profile": profile, "output_limit_bytes": 16 << 20, "memory_mb": 512})
    sb = await _new(provider, made, spec)
    cmd = "head -c 20000000 /dev/zero | tr '\\0' x"
    one = await sb.exec(cmd, timeout=120)
    many = await sb.exec_many([ExecJob(cmd, timeout=120), ExecJob("echo small")])
    for res in (one, many[0]):
        assert res.exit_code == 0 and res.truncated and len(res.stdout_bytes) == 16 << 20, res
    assert not many[1].truncated and many[1].stdout == "small\n"
