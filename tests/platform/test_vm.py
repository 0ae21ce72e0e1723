"""The vm profile through the unmodified SDK (sync and async), as Prime users expect it:
writes to /work and /app, root, a real disk quota (ENOSPC, the sandbox stays RUNNING), and a
sandbox killed by its memory limit reported ERROR / OOM_KILLED (SandboxOOMError)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anyio
import pytest
from prime_sandboxes import APIClient, AsyncSandboxClient, CreateSandboxRequest, SandboxClient, SandboxNotRunningError

from sandgym.platform.testing import ServerThread, serve_in_thread
from tests.conftest import require

from .conftest import IMAGE, need_docker_backend

TOKEN = "vm-token"


def need_vm() -> None:
    need_docker_backend("the vm profile")
    require("vm")


@pytest.fixture(scope="module")
def vm(isolated_home: str) -> Iterator[ServerThread]:
    need_vm()
    with serve_in_thread([TOKEN], "docker", max_sandboxes=3, profile="vm", reap_interval_s=0.5) as s:
        yield s


def _req(**kw: object) -> CreateSandboxRequest:
    base: dict[str, object] = {"name": f"vm-{uuid.uuid4().hex[:6]}", "docker_image": IMAGE, "memory_gb": 0.5, "disk_size_gb": 0.25}
    return CreateSandboxRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_vm_writes_root_and_disk_quota(vm: ServerThread) -> None:
    api = APIClient(api_key=TOKEN)
    api.base_url = vm.url
    c = SandboxClient(api)
    sb = c.create(_req())
    try:
        c.wait_for_creation(sb.id)
        c.upload_bytes(sb.id, "/work/hello.txt", b"hello /work", "hello.txt")
        r = c.execute_command(sb.id, "mkdir -p /app && echo app > /app/x && cat /work/hello.txt /app/x && id -u")
        assert (r.exit_code, r.stdout) == (0, "hello /workapp\n0\n"), r.stderr
        assert c.execute_command(sb.id, "whoami", user="root").stdout == "root\n"
        # Past the 256 MiB quota the writer gets ENOSPC; the sandbox lives on.
        r = c.execute_command(sb.id, "dd if=/dev/zero of=/big bs=1M count=400 2>&1; rm -f /big; echo after", timeout=120)
        assert "No space left on device" in r.stdout and r.stdout.endswith("after\n"), r.stdout
        assert c.get(sb.id).status == "RUNNING"
        assert c.execute_command(sb.id, "echo still here").stdout == "still here\n"
    finally:
        c.delete(sb.id)


@pytest.mark.anyio
async def test_oom_kill_is_error_oom_killed(vm: ServerThread) -> None:
    c = AsyncSandboxClient(api_key=TOKEN)
    c.client.base_url = vm.url
    try:
        sb = await c.create(_req(memory_gb=0.125))
        try:
            await c.wait_for_creation(sb.id)
            # SandboxOOMError, or (when the engine's events come late) SandboxNotRunningError
            # first and the type OOM_KILLED moments later.
            with pytest.raises(SandboxNotRunningError):
                await c.execute_command(sb.id, "python3 -c 'x = bytearray(1 << 30); print(len(x))'", timeout=120)
            for _ in range(100):
                got = await c.get(sb.id)
                if got.error_type == "OOM_KILLED":
                    break
                await anyio.sleep(0.2)
            assert got.status == "ERROR" and got.error_type == "OOM_KILLED", got
            assert got.termination_reason and got.termination_reason.startswith("OOM_KILLED")
        finally:
            await c.delete(sb.id)
    finally:
        await c.aclose()
