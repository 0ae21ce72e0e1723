"""execd -- a docker sandbox's main process, which runs its commands -- SIGKILLed: by a
command inside the sandbox (strict, and vm under gVisor) while an exec is in flight, and
from the host (as the kernel's OOM killer would).

A killed execd takes its sandbox with it (it is the container's main process), so that
sandbox is lost; what is asserted is that the loss is reported, typed, never silent: the
exec in flight and every later call raise SandboxGoneError saying why, `alive()` is False,
and through `sandgym serve` the unmodified SDK sees the sandbox ERROR with an error type and
a typed exception, not a hang or a 500. The other sandboxes answer and their acknowledged
writes read back; nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import docker
import pytest

from sandgym.sandboxes import SandboxManager, SandboxSpec
from sandgym.sandboxes.errors import SandboxGoneError
from sandgym.sandboxes.manager import ManagedSandbox
from tests.conftest import available

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker")]

RUN = uuid.uuid4().hex[:12]
STRICT = SandboxSpec(memory_mb=256, disk_mb=32, ttl_s=900)
# Inside the sandbox (anchored, so the pattern does not match this very shell).
KILL_EXECD = "kill -9 $(pgrep -f '^python3 -I( -S)? /opt/sandgym-execd/server.py'); sleep 30; echo survived"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def manager() -> AsyncIterator[SandboxManager]:
    async with SandboxManager("docker", max_sandboxes=6, run_id=f"faults-execd-{RUN}") as mgr:
        yield mgr


def _execd_host_pid(cid: str) -> int:
    """The host pid of the container's execd (from the engine's process list, matched on the
    full command line: `top`'s may be cut)."""
    client = docker.from_env()
    try:
        procs = client.api.top(cid)["Processes"]
    finally:
        client.close()
    pids = []
    for p in procs:
        try:
            argv = Path(f"/proc/{p[1]}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] != b"/sbin/docker-init" and any(a.endswith(b"execd.sock") for a in argv):
            pids.append(int(p[1]))
    assert len(pids) == 1, [p[-1] for p in procs]
    return pids[0]


def _containers() -> list[str]:
    client = docker.from_env()
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": f"sandgym.owner=faults-execd-{RUN}"})]
    finally:
        client.close()


async def _gone(sb: ManagedSandbox, what: str, misreported: list[str]) -> None:
    """Every call on a lost sandbox raises SandboxGoneError with a reason."""
    for call in (lambda: sb.exec("echo still here"), lambda: sb.read_file("/workspace/acked.txt")):
        try:
            with anyio.fail_after(60):
                await call()
        except SandboxGoneError as exc:
            if not str(exc):
                misreported.append(f"{what}: SandboxGoneError without a reason")
        except Exception as exc:
            misreported.append(f"{what}: {type(exc).__name__} instead of SandboxGoneError: {exc}")
        else:
            misreported.append(f"{what}: answered after its execd was killed")
    if await sb.alive():
        misreported.append(f"{what}: alive() after its execd was killed")


async def test_execd_killed(manager: SandboxManager) -> None:
    specs = {"strict-inside": STRICT, "strict-host": STRICT, "bystander": STRICT}
    if available("vm"):
        specs["vm-inside"] = STRICT.model_copy(update={"profile": "vm"})
    boxes = {name: await manager.acquire(spec) for name, spec in specs.items()}
    for name, sb in boxes.items():
        await sb.write_file("/workspace/acked.txt", f"acked {name}")
    misreported: list[str] = []

    # From inside, with the exec that kills it in flight.
    for name in [n for n in boxes if n.endswith("-inside")]:
        try:
            with anyio.fail_after(60):
                r = await boxes[name].exec(["sh", "-c", KILL_EXECD], timeout=60)
            misreported.append(f"{name}: the exec that killed execd returned {r}")
        except SandboxGoneError as exc:
            assert str(exc)
        except Exception as exc:
            misreported.append(f"{name}: in-flight exec raised {type(exc).__name__}: {exc}")
        await _gone(boxes[name], name, misreported)

    # From the host.
    os.kill(_execd_host_pid(boxes["strict-host"].id), signal.SIGKILL)
    await _gone(boxes["strict-host"], "strict-host", misreported)

    # The bystander answers, its write reads back, and new sandboxes come.
    assert (await boxes["bystander"].read_file("/workspace/acked.txt")) == b"acked bystander"
    assert (await boxes["bystander"].exec("echo ok")).stdout == "ok\n"
    fresh = await manager.acquire(STRICT)
    assert (await fresh.exec("echo fresh")).stdout == "fresh\n"
    lost = len(boxes) - 1
    print(f"\n[fault] execd killed ({', '.join(n for n in boxes if n != 'bystander')}): injected {lost}, "
          f"sandboxes lost {lost} (each reported: SandboxGoneError), writes lost 0 of the survivors, "
          f"misreported {len(misreported)}")
    assert not misreported, misreported
    for sb in [*boxes.values(), fresh]:
        await manager.release(sb)
    with anyio.fail_after(60):
        while _containers():
            await anyio.sleep(0.2)


def test_execd_killed_through_the_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sandgym serve` reports the sandbox whose execd was killed: ERROR with an error type,
    and the SDK's calls on it raise a typed error (no hang, no 500)."""
    from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient, SandboxNotRunningError

    from sandgym.platform.testing import serve_in_thread

    monkeypatch.setenv("HOME", str(tmp_path))
    with serve_in_thread(["tok"], "docker", max_sandboxes=2) as srv:
        api = APIClient(api_key="tok")
        api.base_url = srv.url
        c = SandboxClient(api)
        sb = c.create(CreateSandboxRequest(name="execd", docker_image="sandgym/python:latest", memory_gb=0.5, disk_size_gb=0.25))
        c.wait_for_creation(sb.id)
        assert c.execute_command(sb.id, "echo up").stdout.strip() == "up"
        cid = srv.service.store.get_any(sb.id).container_id  # type: ignore[union-attr]
        assert cid
        os.kill(_execd_host_pid(cid), signal.SIGKILL)
        with pytest.raises(SandboxNotRunningError) as err:
            c.execute_command(sb.id, "echo still here", timeout=30)
        deadline = time.monotonic() + 60
        while (got := c.get(sb.id)).status == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert got.status == "ERROR" and got.error_type, got
        print(f"\n[fault] execd killed under sandgym serve: {type(err.value).__name__}: {err.value}; "
              f"status {got.status}, error_type {got.error_type}: {got.error_message}")
