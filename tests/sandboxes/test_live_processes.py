"""The LiveProcess implementations on real docker sandboxes: output as it appears, stdin,
signals, exit codes (execd's, and the exec-built one that sandboxes without execd get, run
by the docker provider itself and on an execd sandbox); attaching again from a handle, as a
restarted server does, for both; execd's own promises (a hung-up client leaves the process
running and signallable, big stdin and output, background children); and the exec-built one
through `docker exec` when the engine's sockets are past select()'s 1024."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import anyio
import pytest

from sandgym.sandboxes import ManagedSandbox, SandboxManager, SandboxSpec
from sandgym.sandboxes.execd import ExecdLiveProcess, ExecdRequestError
from sandgym.sandboxes.live import LiveHandle, LiveProcess, ShellLiveProcess
from sandgym.sandboxes.providers.docker import DockerProvider
from tests.conftest import require

pytestmark = pytest.mark.anyio

SPEC = SandboxSpec(memory_mb=512, disk_mb=256)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def sandbox() -> AsyncIterator[ManagedSandbox]:
    require("docker")
    async with SandboxManager("docker", max_sandboxes=1) as mgr:
        sb = await mgr.acquire(SPEC)
        try:
            yield sb
        finally:
            await mgr.release(sb)


@pytest.fixture(scope="module")
async def no_execd_sandbox() -> AsyncIterator[ManagedSandbox]:
    """A sandbox whose commands go through `docker exec` (as for images without python3)."""
    require("docker")
    async with SandboxManager(DockerProvider(execd=False), max_sandboxes=1) as mgr:
        sb = await mgr.acquire(SPEC)
        try:
            yield sb
        finally:
            await mgr.release(sb)


KINDS = ["execd", "no-execd", "shell"]


@pytest.fixture
def kind_sandbox(request: pytest.FixtureRequest) -> ManagedSandbox:
    kind = request.node.callspec.params["kind"]
    return request.getfixturevalue("no_execd_sandbox" if kind == "no-execd" else "sandbox")  # type: ignore[no-any-return]


async def _start(kind: str, sb: ManagedSandbox, argv: list[str], env: dict[str, str], cwd: str) -> LiveProcess:
    if kind == "shell":
        shell = ShellLiveProcess(sb, argv)  # what every provider without a streaming API gets
        await shell.start(env, cwd)
        return shell
    proc = await sb.start_live(argv, env=env, cwd=cwd)  # the sandbox's own kind
    assert isinstance(proc, ExecdLiveProcess if kind == "execd" else ShellLiveProcess)
    return proc


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


@pytest.mark.parametrize("kind", KINDS)
async def test_stdin_output_and_terminate(kind_sandbox: ManagedSandbox, kind: str) -> None:
    proc = await _start(kind, kind_sandbox, ["/bin/bash", "-c", "echo ready; echo to-err >&2; while read l; do echo got:$l; done"], {"X": "1"}, "/tmp")
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


@pytest.mark.parametrize("kind", KINDS)
async def test_exit_code_env_and_cwd(kind_sandbox: ManagedSandbox, kind: str) -> None:
    proc = await _start(kind, kind_sandbox, ["/bin/bash", "-c", 'echo "$X $(pwd)"; exit 9'], {"X": "from-env"}, "/tmp")
    try:
        out, _, code, _ = await _collect(proc)
        assert (out, code) == (b"from-env /tmp\n", 9)
    finally:
        await proc.cleanup()


@pytest.mark.parametrize("kind", ["execd", "no-execd"])
async def test_attached_to_again_from_its_handle(kind_sandbox: ManagedSandbox, kind: str) -> None:
    """What a restarted server does: the first driver lets go (its events closed), a new one
    attaches from the handle (through `Sandbox.attach_live`, as rows keep it): output from
    then on, stdin (still open), signals; then, after the exit, the exit status."""
    argv = ["/bin/bash", "-c", "while read l; do echo got:$l; done; exit 3"]
    first = await kind_sandbox.start_live(argv)
    handle = first.handle()
    assert handle is not None and handle.pid == first.pid
    await first.write_stdin(b"a\n")
    out, _, code, it = await _collect(first, until=b"got:a\n")
    assert (out, code) == (b"got:a\n", None)
    await it.aclose()  # type: ignore[attr-defined]  # the driver goes; the process runs on
    again = await kind_sandbox.attach_live(LiveHandle.model_validate(handle.model_dump()), argv)
    assert type(again) is type(first) and again.pid == first.pid
    try:
        await again.write_stdin(b"b\n")
        out, _, code, it = await _collect(again, until=b"got:b\n")
        assert (out, code) == (b"got:b\n", None)
        await again.signal(9)
        with anyio.fail_after(30):
            async for ev in it:
                if ev[0] == "exit":
                    assert ev[1] == 137
                    break
        third = await kind_sandbox.attach_live(handle, argv)  # ended: its exit status at once
        _, _, code, _ = await _collect(third)
        assert code == 137
        await third.cleanup()
    finally:
        await again.cleanup()
        await first.cleanup()


async def test_no_execd_live_process_with_a_high_fd(fds_past_1024: None) -> None:
    """select() cannot watch fds >= 1024; without execd every poll and stdin write of the
    live process is a `docker exec` whose stream must work past that."""
    require("docker")
    # A provider made now: its engine connections (and the exec sockets) are opened above 1024.
    async with SandboxManager(DockerProvider(execd=False), max_sandboxes=1) as mgr:
        sb = await mgr.acquire(SandboxSpec(memory_mb=256, disk_mb=64))
        try:
            proc = await sb.start_live(["/bin/bash", "-c", "echo hi; read l; echo got:$l; exit 4"])
            try:
                assert isinstance(proc, ShellLiveProcess)
                first, _, _, it = await _collect(proc, until=b"hi\n")
                await proc.write_stdin(b"line\n")
                out, code = first, None
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


async def test_execd_process_outlives_its_client_and_can_still_be_signalled(sandbox: ManagedSandbox) -> None:
    proc = await sandbox.start_live(["/bin/bash", "-c", "echo up; exec sleep 300"])
    assert isinstance(proc, ExecdLiveProcess)
    out, _, code, _ = await _collect(proc, until=b"up\n")
    assert (out, code) == (b"up\n", None)
    await proc.cleanup()  # this side hangs up: the process runs on
    alive = await sandbox.exec(["/bin/sh", "-c", f"kill -0 {proc.pid}"])
    assert alive.exit_code == 0, alive.stderr
    await proc.signal(9)
    with anyio.fail_after(30):
        while (await sandbox.exec(["/bin/sh", "-c", f"kill -0 {proc.pid}"])).exit_code == 0:
            await anyio.sleep(0.05)
    # Once it has ended, it is no longer a process execd will signal.
    assert await proc.client.signal(proc.pid, 9) is False


async def test_execd_big_stdin_and_output(sandbox: ManagedSandbox) -> None:
    """More stdin than execd buffers before it stops reading the client (4 MiB), and output
    far past one pipe's worth, arrive whole and in order."""
    data = bytes(range(256)) * (6 * 4096)  # 6 MiB
    n_out = 3_000_000
    proc = await sandbox.start_live(
        ["/bin/bash", "-c", f"head -c {len(data)} | sha256sum; head -c {n_out} /dev/zero | tr '\\0' x"]
    )
    try:
        for i in range(0, len(data), 1 << 20):
            await proc.write_stdin(data[i : i + (1 << 20)])
        out, err, code, _ = await _collect(proc)
        digest, _, rest = out.partition(b"  -\n")
        assert (digest.decode(), code, err) == (hashlib.sha256(data).hexdigest(), 0, b"")
        assert rest == b"x" * n_out
    finally:
        await proc.cleanup()


async def test_execd_exit_is_not_held_by_a_background_child(sandbox: ManagedSandbox) -> None:
    proc = await sandbox.start_live(["/bin/bash", "-c", "sleep 300 & echo started; exit 6"])
    try:
        out, _, code, _ = await _collect(proc)  # within _collect's 30 s, not the child's 300
        assert (out, code) == (b"started\n", 6)
    finally:
        await proc.cleanup()
        await sandbox.exec(["pkill", "-f", "sleep 300"])


@pytest.mark.parametrize("argv, cwd", [(["/no/such/program"], None), (["true"], "/no/such/dir")])
async def test_execd_start_failure_is_an_error(sandbox: ManagedSandbox, argv: list[str], cwd: str | None) -> None:
    with pytest.raises(ExecdRequestError, match="spawn_failed"):
        await sandbox.start_live(argv, cwd=cwd)


async def test_execd_live_process_under_gvisor() -> None:
    """The vm profile (gVisor, whose 2022 kernel lacks pidfd_open: execd polls for the exit)."""
    require("docker", "vm")
    provider = DockerProvider()
    vm = SPEC.model_copy(update={"profile": "vm"})
    async with SandboxManager(provider, max_sandboxes=1) as mgr:
        sb = await mgr.acquire(vm)
        try:
            proc = await sb.start_live(["/bin/bash", "-c", 'echo "$(id -u) $X"; read l; echo "got:$l"; exit 7'], env={"X": "x"})
            try:
                assert isinstance(proc, ExecdLiveProcess)
                await proc.write_stdin(b"in\n")
                out, _, code, _ = await _collect(proc)
                assert (out, code) == (b"0 x\ngot:in\n", 7)
            finally:
                await proc.cleanup()
        finally:
            await mgr.release(sb)
