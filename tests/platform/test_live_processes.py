"""Both LiveProcess implementations on a real docker sandbox: output as it appears, stdin,
signals, exit codes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from sandgym.platform.live_docker import DockerLiveProcess, docker_target
from sandgym.platform.sessions import LiveProcess, ShellLiveProcess
from sandgym.platform.testing import default_backend
from sandgym.sandboxes import ManagedSandbox, SandboxManager, SandboxSpec

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def sandbox() -> AsyncIterator[ManagedSandbox]:
    if default_backend() != "docker":
        pytest.skip("needs the docker engine and the sandgym/python image")
    async with SandboxManager("docker", max_sandboxes=1) as mgr:
        sb = await mgr.acquire(SandboxSpec(memory_mb=512, disk_mb=256))
        try:
            yield sb
        finally:
            await mgr.release(sb)


def _make(kind: str, sb: ManagedSandbox, argv: list[str]) -> LiveProcess:
    if kind == "docker":
        target = docker_target(sb)
        assert target is not None
        return DockerLiveProcess(*target, argv)
    return ShellLiveProcess(sb, argv)


async def _collect(proc: LiveProcess, until: bytes | None = None) -> tuple[bytes, bytes, int | None, AsyncIterator]:
    out, err = b"", b""
    it = proc.events().__aiter__()
    with anyio.fail_after(30):
        async for kind, value in it:
            if kind == "exit":
                return out, err, int(value), it  # type: ignore[arg-type]
            if kind == "stdout":
                out += value  # type: ignore[operator]
            else:
                err += value  # type: ignore[operator]
            if until is not None and until in out:
                return out, err, None, it
    return out, err, None, it


@pytest.mark.parametrize("kind", ["docker", "shell"])
async def test_stdin_output_and_terminate(sandbox: ManagedSandbox, kind: str) -> None:
    proc = _make(kind, sandbox, ["/bin/bash", "-c", "echo ready; echo to-err >&2; while read l; do echo got:$l; done"])
    await proc.start({"X": "1"}, "/tmp")
    try:
        assert proc.pid > 0
        await proc.write_stdin(b"one\ntwo\n")
        out, err, code, it = await _collect(proc, until=b"got:two\n")
        assert out == b"ready\ngot:one\ngot:two\n" and code is None
        await proc.signal(15)
        with anyio.fail_after(30):
            async for ev in it:
                if ev[0] == "exit":
                    assert ev[1] == 143
                    break
                if ev[0] == "stderr":
                    err += ev[1]  # type: ignore[operator]
        assert b"to-err" in err
    finally:
        await proc.cleanup()


@pytest.mark.parametrize("kind", ["docker", "shell"])
async def test_exit_code_env_and_cwd(sandbox: ManagedSandbox, kind: str) -> None:
    proc = _make(kind, sandbox, ["/bin/bash", "-c", 'echo "$X $(pwd)"; exit 9'])
    await proc.start({"X": "from-env"}, "/tmp")
    try:
        out, _, code, _ = await _collect(proc)
        assert (out, code) == (b"from-env /tmp\n", 9)
    finally:
        await proc.cleanup()
