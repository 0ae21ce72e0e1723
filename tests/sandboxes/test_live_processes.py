"""Both LiveProcess implementations on a real docker sandbox: output as it appears, stdin,
signals, exit codes; and the docker one when its socket's fd is past select()'s 1024."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from sandgym.sandboxes import ManagedSandbox, SandboxManager, SandboxSpec
from sandgym.sandboxes.live import LiveProcess, ShellLiveProcess
from sandgym.sandboxes.providers.docker import DockerProvider
from sandgym.sandboxes.providers.docker.live import DockerLiveProcess
from tests.conftest import require_docker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def sandbox() -> AsyncIterator[ManagedSandbox]:
    require_docker()
    async with SandboxManager("docker", max_sandboxes=1) as mgr:
        sb = await mgr.acquire(SandboxSpec(memory_mb=512, disk_mb=256))
        try:
            yield sb
        finally:
            await mgr.release(sb)


async def _start(kind: str, sb: ManagedSandbox, argv: list[str], env: dict[str, str], cwd: str) -> LiveProcess:
    if kind == "docker":  # the sandbox's own kind: docker streams through the exec API
        proc = await sb.start_live(argv, env=env, cwd=cwd)
        assert isinstance(proc, DockerLiveProcess)
        return proc
    shell = ShellLiveProcess(sb, argv)  # what every other provider gets
    await shell.start(env, cwd)
    return shell


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
    proc = await _start(kind, sandbox, ["/bin/bash", "-c", "echo ready; echo to-err >&2; while read l; do echo got:$l; done"], {"X": "1"}, "/tmp")
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
    proc = await _start(kind, sandbox, ["/bin/bash", "-c", 'echo "$X $(pwd)"; exit 9'], {"X": "from-env"}, "/tmp")
    try:
        out, _, code, _ = await _collect(proc)
        assert (out, code) == (b"from-env /tmp\n", 9)
    finally:
        await proc.cleanup()


async def test_docker_live_process_with_a_high_fd(fds_past_1024: None) -> None:
    """select() cannot watch fds >= 1024; the docker live process must work past that."""
    require_docker()
    # A provider made now: its engine connections (and the exec socket) are opened above 1024.
    async with SandboxManager(DockerProvider(), max_sandboxes=1) as mgr:
        sb = await mgr.acquire(SandboxSpec(memory_mb=256, disk_mb=64))
        try:
            proc = await sb.start_live(["/bin/bash", "-c", "echo hi; read l; echo got:$l; exit 4"])
            try:
                assert isinstance(proc, DockerLiveProcess)
                first, _, _, it = await _collect(proc, until=b"hi\n")  # the follower's stream is open
                assert proc._stream is not None and proc._stream.sock.fileno() >= 1024
                await proc.write_stdin(b"line\n")
                out, _, code = first, b"", None
                with anyio.fail_after(30):
                    async for kind, value in it:
                        if kind == "exit":
                            code = int(value)  # type: ignore[arg-type]
                            break
                        if kind == "stdout":
                            out += value  # type: ignore[operator]
                assert (out, code) == (b"hi\ngot:line\n", 4)
            finally:
                await proc.cleanup()
        finally:
            await mgr.release(sb)
