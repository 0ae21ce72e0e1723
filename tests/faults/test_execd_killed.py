"""execd -- which runs a docker sandbox's commands -- SIGKILLed: by a command inside the
sandbox (strict, and vm under gVisor) while that exec is in flight, and from the host (as the
kernel's OOM killer would) while another exec is in flight.

execd is the container's init (PID 1) and serves from a child it starts again when that is
killed, so such a kill costs the requests in flight, not the sandbox. Asserted: the exec in
flight raises SandboxInterruptedError (typed; never a hang, a wrong result or a vanished
sandbox) and its leftovers are killed; afterwards the sandbox answers, its acknowledged write
reads back and its background process still runs; through `sandgym serve` the unmodified SDK
sees the sandbox RUNNING and its commands answer. Killing init itself from the host is
`docker kill`: that sandbox is lost, and every call on it says so (SandboxGoneError
REMOVED). A bystander answers throughout; nothing is left behind.
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
from sandgym.sandboxes.errors import SandboxGoneError, SandboxInterruptedError
from sandgym.sandboxes.manager import ManagedSandbox
from tests.conftest import available

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker")]

RUN = uuid.uuid4().hex[:12]
STRICT = SandboxSpec(memory_mb=256, disk_mb=32, ttl_s=900)
# Inside the sandbox: every execd process (anchored, so the pattern does not match this very
# shell); init, PID 1, is among them, and Linux delivers no signal from inside to it...
KILL_EXECD = "kill -9 $(pgrep -f '^python3 -I( -S)? /opt/sandgym-execd/server.py'); sleep 30; echo survived"
# ... but gVisor does: there only the serving execd (this shell's parent) is killed, and
# killing init from inside a gVisor sandbox is its own case below.
KILL_SERVING_EXECD = "kill -9 $PPID; sleep 30; echo survived"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def manager() -> AsyncIterator[SandboxManager]:
    async with SandboxManager("docker", max_sandboxes=8, run_id=f"faults-execd-{RUN}") as mgr:
        yield mgr


def _init_host_pid(cid: str) -> int:
    """The host pid of the container's main process (execd's init)."""
    client = docker.from_env()
    try:
        return int(client.api.inspect_container(cid)["State"]["Pid"])
    finally:
        client.close()


def _state(pid: int) -> str:
    """The process's state letter from /proc (R, S, Z, ...), or "gone"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0].decode()
    except OSError:
        return "gone"


def _kill_and_wait(pid: int) -> None:
    """SIGKILL `pid` and wait until it has died: kill() returns before the process is gone,
    and an exec sent in that moment is still answered (seen on a loaded machine)."""
    os.kill(pid, signal.SIGKILL)
    for _ in range(500):
        if _state(pid) in ("gone", "Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} still runs 5 s after SIGKILL")


def _execd_host_pid(cid: str) -> int:
    """The host pid of the container's serving execd: init's child running server.py."""
    init = _init_host_pid(cid)
    pids = []
    for child in Path(f"/proc/{init}/task/{init}/children").read_text().split():
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/opt/sandgym-execd/server.py") for a in argv):
            pids.append(int(child))
    assert len(pids) == 1, pids
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
                got = await call()
        except SandboxGoneError as exc:
            if not str(exc) or exc.reason != "REMOVED":
                misreported.append(f"{what}: SandboxGoneError {exc.reason}: {exc}")
        except Exception as exc:
            misreported.append(f"{what}: {type(exc).__name__} instead of SandboxGoneError: {exc}")
        else:
            misreported.append(f"{what}: answered after its init was killed: {got!r}")
    if await sb.alive():
        misreported.append(f"{what}: alive() after its init was killed")


async def _intact(sb: ManagedSandbox, name: str, misreported: list[str]) -> None:
    """The sandbox answers, its acknowledged write reads back, its background process runs,
    and nothing of the interrupted exec is left."""
    try:
        with anyio.fail_after(60):
            if (got := await sb.read_file("/workspace/acked.txt")) != f"acked {name}".encode():
                misreported.append(f"{name}: acknowledged write reads back as {got!r}")
            ps = (await sb.exec(["ps", "-eo", "args="])).stdout
            if "sleep 901" not in ps:
                misreported.append(f"{name}: its background process is gone: {ps}")
            for _ in range(50):  # the interrupted command's leftovers are swept
                if "sleep 30" not in ps and "sleep 40" not in ps:
                    break
                await anyio.sleep(0.1)
                ps = (await sb.exec(["ps", "-eo", "args="])).stdout
            else:
                misreported.append(f"{name}: the interrupted command still runs: {ps}")
            if not await sb.alive():
                misreported.append(f"{name}: alive() is False")
    except Exception as exc:
        misreported.append(f"{name}: {type(exc).__name__} after the kill: {exc}")


async def _interrupted(call: object, name: str, misreported: list[str]) -> None:
    try:
        with anyio.fail_after(90):
            r = await call  # type: ignore[misc]  # an awaitable exec
        misreported.append(f"{name}: the exec in flight returned {r}")
    except SandboxInterruptedError as exc:
        assert str(exc)
    except Exception as exc:
        misreported.append(f"{name}: in-flight exec raised {type(exc).__name__}: {exc}")


async def test_execd_killed(manager: SandboxManager) -> None:
    specs = {"strict-inside": STRICT, "strict-host": STRICT, "init-host": STRICT, "bystander": STRICT}
    if available("vm"):
        specs["vm-inside"] = specs["vm-init-inside"] = STRICT.model_copy(update={"profile": "vm"})
    boxes = {name: await manager.acquire(spec) for name, spec in specs.items()}
    for name, sb in boxes.items():
        await sb.write_file("/workspace/acked.txt", f"acked {name}")
        await sb.exec("sleep 901 >/dev/null 2>&1 &")
    misreported: list[str] = []

    # From inside, with the exec that kills it in flight.
    inside = [n for n in boxes if n.endswith("-inside") and "init" not in n]
    for name in inside:
        kill = KILL_SERVING_EXECD if name.startswith("vm-") else KILL_EXECD
        await _interrupted(boxes[name].exec(["sh", "-c", kill], timeout=60), name, misreported)
        await _intact(boxes[name], name, misreported)

    # From the host, with another exec in flight.
    async with anyio.create_task_group() as tg:
        tg.start_soon(_interrupted, boxes["strict-host"].exec("sleep 40; echo done", timeout=60), "strict-host",
                      misreported)
        await anyio.sleep(1.0)
        os.kill(_execd_host_pid(boxes["strict-host"].id), signal.SIGKILL)
    await _intact(boxes["strict-host"], "strict-host", misreported)

    # init itself, from the host (`docker kill`), and from inside under gVisor, which (unlike
    # Linux) delivers a SIGKILL from inside to the sandbox's init: these take the sandbox.
    _kill_and_wait(_init_host_pid(boxes["init-host"].id))
    await _gone(boxes["init-host"], "init-host", misreported)
    if "vm-init-inside" in boxes:
        try:
            with anyio.fail_after(60):
                await boxes["vm-init-inside"].exec(["sh", "-c", KILL_EXECD], timeout=60)
            misreported.append("vm-init-inside: the exec that killed init returned")
        except SandboxGoneError as exc:
            assert str(exc)
        await _gone(boxes["vm-init-inside"], "vm-init-inside", misreported)

    # The bystander answers, its write reads back, and new sandboxes come.
    assert (await boxes["bystander"].read_file("/workspace/acked.txt")) == b"acked bystander"
    assert (await boxes["bystander"].exec("echo ok")).stdout == "ok\n"
    fresh = await manager.acquire(STRICT)
    assert (await fresh.exec("echo fresh")).stdout == "fresh\n"
    killed = [*inside, "strict-host"]
    inits = [n for n in boxes if n.startswith(("init-", "vm-init-"))]
    print(f"\n[fault] execd killed ({', '.join(killed)}): injected {len(killed)}, sandboxes lost 0, writes lost 0, "
          f"misreported {len(misreported)} (each exec in flight: SandboxInterruptedError); init killed ({', '.join(inits)}): "
          f"{len(inits)} sandboxes lost, each reported SandboxGoneError REMOVED")
    assert not misreported, misreported
    for sb in [*boxes.values(), fresh]:
        await manager.release(sb)
    with anyio.fail_after(60):
        while _containers():
            await anyio.sleep(0.2)


def test_execd_killed_through_the_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `sandgym serve` a killed execd costs the command in flight (a typed error the
    SDK raises), not the sandbox: it stays RUNNING and answers, with its files."""
    from prime_sandboxes import APIClient, APIError, CreateSandboxRequest, SandboxClient

    from sandgym.platform.testing import serve_in_thread

    monkeypatch.setenv("HOME", str(tmp_path))
    with serve_in_thread(["tok"], "docker", max_sandboxes=2) as srv:
        api = APIClient(api_key="tok")
        api.base_url = srv.url
        c = SandboxClient(api)
        sb = c.create(CreateSandboxRequest(name="execd", docker_image="sandgym/python:latest", memory_gb=0.5, disk_size_gb=0.25))
        c.wait_for_creation(sb.id)
        assert c.execute_command(sb.id, "echo up > /workspace/acked.txt; cat /workspace/acked.txt").stdout.strip() == "up"
        cid = srv.service.store.get_any(sb.id).container_id  # type: ignore[union-attr]
        assert cid
        with pytest.raises(APIError) as err:
            c.execute_command(sb.id, "kill -9 $(pgrep -f '^python3 -I( -S)? /opt/sandgym-execd/server.py'); sleep 30",
                              timeout=60)
        os.kill(_execd_host_pid(cid), signal.SIGKILL)  # and once more from the host, between calls
        time.sleep(0.5)
        assert c.execute_command(sb.id, "cat /workspace/acked.txt", timeout=30).stdout.strip() == "up"
        got = c.get(sb.id)
        assert got.status == "RUNNING", got
        print(f"\n[fault] execd killed under sandgym serve: the command in flight: {type(err.value).__name__}: "
              f"{err.value}; then status {got.status}, commands answer")
        c.delete(sb.id)
