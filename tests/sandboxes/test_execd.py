"""execd, the in-sandbox exec daemon: the real server as a host subprocess on a unix socket, and
then inside a real hardened container (network none) reached through a bind-mounted socket."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import docker
import pytest

from sandgym.sandboxes.errors import SandboxFileNotFound, SandboxGoneError
from sandgym.sandboxes.execd import (
    SERVER_PATH,
    BatchJob,
    ExecdClient,
    ExecdConnectionLost,
    ExecdLiveProcess,
    ExecdRequestError,
    ExecdTransport,
    ExecdUnresponsiveError,
    execd_command,
)
from sandgym.sandboxes.execd import daemon as execd_server
from sandgym.sandboxes.live import Event, LiveHandle
from sandgym.sandboxes.providers.docker.execd import execd_volumes
from tests.conftest import require

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _start(sock: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(SERVER_PATH), "--socket", str(sock), *extra])
    end = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise RuntimeError(f"execd did not start (rc={proc.poll()})")
        time.sleep(0.01)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _pids_with(marker: str) -> list[int]:
    """Processes whose command line contains `marker` (our unique sleep arguments)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z":
            found.append(int(name))
    return found


def _marker() -> str:
    """A unique `sleep` argument so /proc checks only see processes of this test."""
    return f"{100 + (uuid.uuid4().int % 10**6) / 10**7:.7f}"


def _wait_gone(marker: str, within: float = 15.0) -> list[int]:
    end = time.monotonic() + within
    while (left := _pids_with(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def _kill_marked(marker: str) -> None:
    for pid in _pids_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def execd(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    sock = tmp_path / "execd.sock"
    proc = _start(sock, "--ttl", "300")
    yield proc, sock
    _stop(proc)


@pytest.fixture
async def client(execd: tuple[subprocess.Popen[bytes], Path]) -> ExecdClient:
    c = ExecdClient(execd[1])
    await c.wait_ready(10)
    yield c  # type: ignore[misc]
    await c.aclose()


# ----------------------------------------------------------------------------- exec


async def test_ping_reports_execd(client: ExecdClient, execd) -> None:
    info = await client.ping()
    assert info["ok"] and info["pid"] == execd[0].pid and info["protocol"] == 1
    assert 0 < info["ttl_left_s"] <= 300


async def test_exec_basics_and_stderr(client: ExecdClient) -> None:
    r = await client.exec(["sh", "-c", "echo out; echo err >&2"], timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\n", "err\n")
    assert r.ok and not r.timed_out and not r.truncated and r.duration_s > 0
    r = await client.exec("echo $((6*7))", timeout=10)  # a string runs under bash -c
    assert r.stdout == "42\n"


async def test_exit_codes(client: ExecdClient) -> None:
    assert (await client.exec(["sh", "-c", "exit 3"], timeout=10)).exit_code == 3
    assert (await client.exec(["sh", "-c", "kill -9 $$"], timeout=10)).exit_code == 137
    assert (await client.exec(["sh", "-c", "kill -TERM $$"], timeout=10)).exit_code == 143
    missing = await client.exec(["/no/such/program"], timeout=10)
    assert missing.exit_code == 127 and "/no/such/program" in missing.stderr
    assert (await client.exec(["true"], timeout=10, cwd="/no/such/dir")).exit_code == 127


async def test_env_and_cwd(client: ExecdClient, tmp_path: Path) -> None:
    r = await client.exec(["sh", "-c", 'echo "$FOO|$BAR"; pwd'], timeout=10, env={"FOO": "a b", "BAR": "ü"}, cwd=str(tmp_path))
    assert r.stdout == f"a b|ü\n{tmp_path}\n"
    # execd's own environment (PATH) is kept underneath
    assert (await client.exec(["sh", "-c", "echo $PATH"], timeout=10, env={"X": "1"})).stdout.strip()


async def test_stdin_and_binary_byte_exact(client: ExecdClient) -> None:
    every_byte = bytes(range(256)) * 4
    r = await client.exec(["cat"], timeout=10, stdin=every_byte)
    assert r.stdout_bytes == every_byte
    big = os.urandom(5 << 20)  # larger than any pipe buffer: stdin and stdout interleave
    r = await client.exec(["cat"], timeout=30, stdin=big, output_limit=6 << 20)
    assert r.stdout_bytes == big and not r.truncated
    r = await client.exec(["python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))"], timeout=10)
    assert r.stdout_bytes == bytes(range(256))
    # a command that ignores its stdin still finishes
    r = await client.exec(["true"], timeout=10, stdin=big)
    assert r.exit_code == 0


async def test_timeout_kills_the_process_group(client: ExecdClient) -> None:
    m = _marker()
    t0 = time.monotonic()
    try:
        r = await client.exec(["sh", "-c", f"sleep {m} & sleep {m}"], timeout=1)
        elapsed = time.monotonic() - t0
        assert r.timed_out and r.exit_code == 124 and not r.ok
        assert elapsed < 30  # far below the sleeps: nothing waited for them
        assert _wait_gone(m) == []
    finally:
        _kill_marked(m)


async def test_output_cap_keeps_draining(client: ExecdClient) -> None:
    r = await client.exec(["sh", "-c", "yes | head -c 20000000; yes e | head -c 3000000 >&2"], timeout=60, output_limit=1000)
    assert r.exit_code == 0 and r.truncated and r.output_limit == 1000
    assert r.stdout_bytes == b"y\n" * 500 and r.stderr_bytes == b"e\n" * 500
    r = await client.exec(["sh", "-c", "printf 12345"], timeout=10, output_limit=5)
    assert r.stdout == "12345" and not r.truncated


async def test_background_child_holding_pipes_does_not_block(client: ExecdClient, tmp_path: Path) -> None:
    m = _marker()
    go, done = tmp_path / "go", tmp_path / "done"
    # The child keeps writing to the inherited stdout after the command returned (it starts
    # once `go` exists, made after the exec's result: no race with a loaded machine): execd
    # must not block on it, and must not close the pipe under it (EPIPE would kill it).
    script = (f"(while [ ! -e {go} ]; do sleep 0.02; done; for i in 1 2 3; do echo tick; sleep 0.1; done; "
              f"touch {done}; sleep {m}) & echo started")
    try:
        r = await client.exec(["sh", "-c", script], timeout=20)
        go.touch()
        assert r.exit_code == 0 and r.stdout == "started\n" and not r.timed_out
        end = time.monotonic() + 15
        while not done.exists() and time.monotonic() < end:
            await anyio.sleep(0.05)
        assert done.exists()
        assert _pids_with(m)  # left running: only a timeout kills the group
    finally:
        _kill_marked(m)


async def test_streaming_output(client: ExecdClient) -> None:
    seen: list[tuple[str, bytes]] = []

    async def on_output(stream: str, chunk: bytes) -> None:
        seen.append((stream, chunk))

    r = await client.exec(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done; echo x >&2"], timeout=10, on_output=on_output)
    assert b"".join(c for s, c in seen if s == "stdout") == r.stdout_bytes == b"1\n2\n3\n"
    assert b"".join(c for s, c in seen if s == "stderr") == b"x\n"


async def test_fifty_concurrent_execs(client: ExecdClient) -> None:
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        r = await client.exec(["sh", "-c", 'sleep 0.2; echo "$0"', str(i)], timeout=60)
        results[i] = r.stdout

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(one, i)
    assert results == {i: f"{i}\n" for i in range(50)}


async def test_batch_exec_mixed(client: ExecdClient) -> None:
    m = _marker()
    jobs = [
        BatchJob(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], timeout=30, stdin="abc"),
        BatchJob(["python3", "-c", "assert 1 == 2"], timeout=30),
        {"argv": ["sleep", m], "timeout": 1},
        BatchJob("echo $V; pwd", timeout=30, env={"V": "v"}, cwd="/"),
    ] + [BatchJob(["sh", "-c", f"exit {i % 3}"], timeout=30) for i in range(20)]
    try:
        rs = await client.batch_exec(jobs, parallel=4)
    finally:
        _kill_marked(m)
    assert len(rs) == 24
    assert rs[0].ok and rs[0].stdout == "cba\n"
    assert rs[1].exit_code == 1 and "AssertionError" in rs[1].stderr
    assert rs[2].timed_out and rs[2].exit_code == 124
    assert rs[3].stdout == "v\n/\n"
    assert [r.exit_code for r in rs[4:]] == [i % 3 for i in range(20)]
    assert await client.batch_exec([]) == []


async def test_cancelled_request_kills_its_command(client: ExecdClient) -> None:
    m = _marker()
    try:
        with anyio.move_on_after(0.5):
            await client.exec(["sh", "-c", f"sleep {m}"], timeout=60)
        assert _wait_gone(m) == []  # the hang-up reached execd, which killed the group
        assert (await client.exec(["echo", "still fine"], timeout=10)).stdout == "still fine\n"
    finally:
        _kill_marked(m)


# ----------------------------------------------------------------------------- live processes


async def _read_until(events: AsyncIterator[Event], want: bytes) -> tuple[bytes, int | None]:
    """stdout from a live process's `events()` (one iterator per process: closing it hangs
    up) until `want` shows (exit None) or it exits (its code)."""
    out = b""
    with anyio.fail_after(30):
        async for kind, value in events:
            if kind == "exit":
                return out, int(value)
            if kind == "stdout":
                out += value  # type: ignore[operator]
                if want in out:
                    return out, None
    return out, None


async def test_live_process_is_attached_to_again_with_its_stdin_still_open(client: ExecdClient) -> None:
    """A client that hangs up leaves the process running with its stdin open; another
    client attaches by the handle: output from then on, stdin, the exit status."""
    argv = ["sh", "-c", "while read l; do echo got:$l; done; echo eof; exit 3"]
    first = ExecdLiveProcess(client, argv)
    await first.start(None, None)
    handle = first.handle()
    assert handle is not None and handle.kind == "execd" and handle.pid == first.pid
    await first.write_stdin(b"a\n")
    assert (await _read_until(first.events(), b"got:a\n")) == (b"got:a\n", None)
    await first.cleanup()  # hang up
    again = ExecdLiveProcess(client, argv, handle)
    await again.attach()
    assert again.pid == first.pid
    events = again.events()
    try:
        await again.write_stdin(b"b\n")  # had execd closed its stdin, the loop would have ended
        assert (await _read_until(events, b"got:b\n")) == (b"got:b\n", None)
        await again.write_stdin(b"c\n")
        assert (await _read_until(events, b"got:c\n")) == (b"got:c\n", None)
    finally:
        await again.signal(signal.SIGKILL)
    assert (await _read_until(events, b"never")) == (b"", 128 + signal.SIGKILL)
    await again.cleanup()


async def test_exit_while_no_client_is_attached_is_kept_for_an_attach(client: ExecdClient, tmp_path: Path) -> None:
    go = tmp_path / "go"
    first = ExecdLiveProcess(client, ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done; echo bye; exit 5'])
    await first.start(None, None)
    handle = first.handle()
    assert handle is not None
    await first.cleanup()  # hang up, then let it end
    go.touch()
    with anyio.fail_after(30):
        while await client.signal(first.pid, 0):  # signallable until it has ended
            await anyio.sleep(0.02)
    for _ in range(2):  # and for every attach after that
        late = ExecdLiveProcess(client, ["sh"], handle)
        await late.attach()
        assert late.pid == first.pid
        assert (await _read_until(late.events(), b"never")) == (b"", 5)  # its output went with no client
        await late.cleanup()


async def test_a_second_attach_takes_the_process_over(client: ExecdClient) -> None:
    first = ExecdLiveProcess(client, ["sh", "-c", "while read l; do echo got:$l; done"])
    await first.start(None, None)
    handle = first.handle()
    assert handle is not None
    second = ExecdLiveProcess(client, ["sh"], handle)
    await second.attach()
    try:
        with pytest.raises(ExecdRequestError, match="detached"):
            await _read_until(first.events(), b"never")
        await second.write_stdin(b"x\n")
        assert (await _read_until(second.events(), b"got:x\n")) == (b"got:x\n", None)
    finally:
        await second.signal(signal.SIGKILL)
        await second.cleanup()
        await first.cleanup()


async def test_attach_to_an_unknown_process_is_refused(client: ExecdClient) -> None:
    unknown = LiveHandle(kind="execd", key="0123456789abcdef", pid=1)
    with pytest.raises(RuntimeError, match="not_found"):
        await ExecdLiveProcess(client, ["true"], unknown).attach()


# ----------------------------------------------------------------------------- files


async def test_write_and_read_file(client: ExecdClient, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.bin"
    data = os.urandom(3 << 20)
    await client.write_file(str(target), data, mode=0o600)
    assert target.read_bytes() == data and (target.stat().st_mode & 0o777) == 0o600
    assert await client.read_file(str(target)) == data
    await client.write_file(str(target), "short", mode=0o755)  # replace, text, new mode
    assert await client.read_file(str(target)) == b"short" and (target.stat().st_mode & 0o777) == 0o755
    with pytest.raises(SandboxFileNotFound):
        await client.read_file(str(tmp_path / "missing"))
    with pytest.raises(ExecdRequestError) as exc:
        await client.read_file(str(tmp_path))
    assert exc.value.code == "is_a_directory"


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_archives_round_trip(client: ExecdClient, tmp_path: Path) -> None:
    dest = tmp_path / "new" / "dir"
    await client.put_archive(str(dest), _tar({"x.txt": b"x", "sub/y.bin": bytes(range(256))}))
    assert (dest / "x.txt").read_bytes() == b"x" and (dest / "sub" / "y.bin").read_bytes() == bytes(range(256))
    data = await client.get_archive(str(dest))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = sorted(tar.getnames())
        assert tar.extractfile("dir/sub/y.bin").read() == bytes(range(256))  # type: ignore[union-attr]
    assert names == ["dir", "dir/sub", "dir/sub/y.bin", "dir/x.txt"]
    single = await client.get_archive(str(dest / "x.txt"))
    with tarfile.open(fileobj=io.BytesIO(single)) as tar:
        assert tar.getnames() == ["x.txt"]
    with pytest.raises(SandboxFileNotFound):
        await client.get_archive(str(tmp_path / "nope"))


async def test_unsafe_archive_refused(client: ExecdClient, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    with pytest.raises(ExecdRequestError) as exc:
        await client.put_archive(str(dest), _tar({"../escaped.txt": b"evil"}))
    assert exc.value.code == "bad_archive" and not (tmp_path / "escaped.txt").exists()


@pytest.mark.parametrize("archive", ["dotdot", "abslink", "linkescape", "device"])
def test_fallback_tar_filter(archive: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian bookworm's python3 (3.11.2) has no tarfile data filter; execd's own one
    must refuse the same escapes."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ok = tarfile.TarInfo("fine.txt")
        ok.size, ok.mode = 2, 0o4777
        tar.addfile(ok, io.BytesIO(b"ok"))
        if archive == "dotdot":
            bad = tarfile.TarInfo("a/../../out.txt")
            bad.size = 1
            tar.addfile(bad, io.BytesIO(b"x"))
        elif archive == "abslink":
            bad = tarfile.TarInfo("link")
            bad.type, bad.linkname = tarfile.SYMTYPE, "/etc"
            tar.addfile(bad)
        elif archive == "linkescape":
            link = tarfile.TarInfo("up")
            link.type, link.linkname = tarfile.SYMTYPE, ".."
            tar.addfile(link)
        else:
            bad = tarfile.TarInfo("dev")
            bad.type = tarfile.CHRTYPE
            tar.addfile(bad)
    dest = tmp_path / "dest"
    with pytest.raises(execd_server.RequestError) as exc:
        execd_server.put_archive(str(dest), buf.getvalue())
    assert exc.value.code == "bad_archive"
    assert (dest / "fine.txt").read_bytes() == b"ok"
    assert (dest / "fine.txt").stat().st_mode & 0o7777 == 0o755  # set-id and group/other write dropped
    assert not (tmp_path / "out.txt").exists()


def test_run_command_without_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels or seccomp profiles without pidfd_open: execd polls for exit instead."""
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    res, out, err = execd_server.run_command(
        ["sh", "-c", "echo hi; echo e >&2; exit 5"], env=None, cwd=None, stdin=b"", timeout=10, limit=100
    )
    assert (res["exit_code"], out, err, res["timed_out"]) == (5, b"hi\n", b"e\n", False)
    m = _marker()
    try:
        res, out, _ = execd_server.run_command(
            ["sh", "-c", f"sleep {m} & sleep {m}"], env=None, cwd=None, stdin=None, timeout=0.5, limit=100
        )
        assert res["timed_out"] and res["exit_code"] == 124
        assert _wait_gone(m) == []
        res, out, _ = execd_server.run_command(
            ["sh", "-c", f"sleep {m} & echo bg"], env=None, cwd=None, stdin=None, timeout=10, limit=100
        )
        assert out == b"bg\n" and not res["timed_out"]
    finally:
        _kill_marked(m)


# ----------------------------------------------------------------------------- lifecycle


async def test_ttl_exit_kills_running_commands(tmp_path: Path) -> None:
    sock = tmp_path / "ttl.sock"
    proc = _start(sock, "--ttl", "2")
    m = _marker()
    try:
        c = ExecdClient(sock)
        with pytest.raises(SandboxGoneError):
            await c.exec(["sleep", m], timeout=60)
        assert proc.wait(30) == 0
        assert not sock.exists()
        assert _wait_gone(m) == []
        with pytest.raises(SandboxGoneError):
            await c.ping()
    finally:
        _stop(proc)
        _kill_marked(m)


async def test_sigterm_stops_execd_and_commands(execd, client: ExecdClient) -> None:
    proc, sock = execd
    m = _marker()
    try:
        async with anyio.create_task_group() as tg:

            async def terminate() -> None:
                await anyio.sleep(0.5)
                proc.send_signal(signal.SIGTERM)

            tg.start_soon(terminate)
            with pytest.raises(SandboxGoneError):
                await client.exec(["sleep", m], timeout=60)
        assert proc.wait(30) == 0 and not sock.exists()
        assert _wait_gone(m) == []
    finally:
        _kill_marked(m)


async def test_server_killed_mid_request_raises_gone(execd, client: ExecdClient) -> None:
    proc, _ = execd
    m = _marker()
    try:
        async with anyio.create_task_group() as tg:

            async def kill() -> None:
                await anyio.sleep(0.5)
                proc.kill()

            tg.start_soon(kill)
            with pytest.raises(SandboxGoneError):
                await client.exec(["sleep", m], timeout=60)
    finally:
        _kill_marked(m)  # SIGKILL gave execd no chance to clean up; we do


async def test_hung_execd_hits_client_deadline(execd) -> None:
    proc, sock = execd
    c = ExecdClient(sock, grace_s=0.5)
    await c.wait_ready(10)
    proc.send_signal(signal.SIGSTOP)  # a real execd that stops answering
    try:
        with pytest.raises(ExecdUnresponsiveError):
            await c.exec(["true"], timeout=0.5)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert (await c.exec(["echo", "back"], timeout=10)).stdout == "back\n"
    await c.aclose()


async def test_transport_adapter_fits_the_docker_seam(execd, tmp_path: Path) -> None:
    from sandgym.sandboxes.providers.docker.transport import Transport

    t = ExecdTransport(execd[1])
    assert isinstance(t, Transport)
    await t.wait_ready(10)
    r = await t.exec(["sh", "-c", "head -c 5000 /dev/zero"], timeout=10, limit=1024, stdin=None)
    assert r.truncated and len(r.stdout_bytes) == 1024 and r.output_limit == 1024
    await t.write_file(str(tmp_path / "f"), b"data", 0o640)
    assert await t.read_file(str(tmp_path / "f")) == b"data"
    with pytest.raises(SandboxFileNotFound):
        await t.get_archive(str(tmp_path / "missing"))
    await t.aclose()


def test_client_survives_a_new_event_loop(execd) -> None:
    """Pooled connections belong to one event loop; a later anyio.run() must not reuse them."""
    c = ExecdClient(execd[1])

    async def once() -> str:
        return (await c.exec(["echo", "hi"], timeout=10)).stdout

    assert anyio.run(once) == "hi\n"
    assert anyio.run(once) == "hi\n"
    anyio.run(c.aclose)


async def test_unreachable_socket(tmp_path: Path) -> None:
    c = ExecdClient(tmp_path / "none.sock")
    with pytest.raises(SandboxGoneError):
        await c.ping()
    with pytest.raises(Exception) as exc:
        await c.wait_ready(0.3)
    assert "not ready" in str(exc.value)


# ----------------------------------------------------------------------------- docker

IMAGE = "sandgym/python:latest"
TMPFS = {"/workspace": "size=64m,uid=1000,gid=1000,mode=0755,exec", "/tmp": "size=64m,mode=1777,exec"}


def _engine() -> docker.DockerClient:
    require("docker", f"image:{IMAGE}")
    return docker.from_env()


def _socket_dir() -> Path:
    host_dir = Path(tempfile.mkdtemp(prefix="sandgym-execd-"))
    os.chown(host_dir, 1000, 1000)  # execd (uid 1000) creates its socket here;
    host_dir.chmod(0o700)  # nobody else on the host may connect (root still can)
    return host_dir


@pytest.fixture(scope="module")
def container_sock() -> Iterator[tuple[object, Path]]:
    engine = _engine()
    host_dir = _socket_dir()
    ctr = engine.containers.run(
        IMAGE,
        execd_command(ttl_s=600),
        detach=True,
        network_mode="none",
        read_only=True,
        tmpfs=TMPFS,
        user="1000",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit="128m",
        memswap_limit="128m",
        pids_limit=256,
        nano_cpus=1_000_000_000,
        volumes=execd_volumes(host_dir),
        labels={"sandgym.owner": "test-execd"},
    )
    try:
        yield ctr, host_dir / "execd.sock"
    finally:
        ctr.remove(force=True)
        shutil.rmtree(host_dir, ignore_errors=True)


@pytest.mark.docker
async def test_execd_in_hardened_container(container_sock) -> None:
    ctr, sock = container_sock
    c = ExecdClient(sock)
    try:
        info = await c.wait_ready(60)
        assert info["pid"] != 1 and info["uid"] == 1000  # init's child, unprivileged
        init = await c.exec(["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"], timeout=20)
        assert "/opt/sandgym-execd/server.py" in init.stdout  # execd's own init is PID 1
        assert info["cpus"] == 1  # batch parallelism follows the CPU quota, not the host
        r = await c.exec(["sh", "-c", "id -u; pwd; ls /sys/class/net"], timeout=20)
        assert r.exit_code == 0 and r.stdout.split() == ["1000", "/workspace", "lo"]  # network none
        data = bytes(range(256)) * 1000
        await c.write_file("/workspace/deep/x.bin", data)
        assert (await c.exec(["sha256sum", "/workspace/deep/x.bin"], timeout=20)).exit_code == 0
        assert await c.read_file("/workspace/deep/x.bin") == data
        with pytest.raises(ExecdRequestError) as exc:
            await c.write_file("/etc/evil", b"x")  # read-only root
        assert exc.value.code in {"read_only", "permission_denied"}
        with pytest.raises(SandboxFileNotFound):
            await c.read_file("/workspace/missing")
        # Debian's python3 lacks tarfile's data filter: execd's own filter runs here
        await c.put_archive("/workspace/t", _tar({"a/b.txt": b"hello"}))
        assert (await c.exec(["cat", "/workspace/t/a/b.txt"], timeout=20)).stdout == "hello"
        with pytest.raises(ExecdRequestError):
            await c.put_archive("/workspace/t", _tar({"../../tmp/escape": b"x"}))
        assert (await c.exec(["test", "-e", "/tmp/escape"], timeout=20)).exit_code == 1
        with tarfile.open(fileobj=io.BytesIO(await c.get_archive("/workspace/t"))) as tar:
            assert "t/a/b.txt" in tar.getnames()
        rs = await c.batch_exec([BatchJob(["python3", "-c", f"print({i}*{i})"], timeout=30) for i in range(16)])
        assert [r.stdout.strip() for r in rs] == [str(i * i) for i in range(16)]
    finally:
        await c.aclose()


@pytest.mark.docker
async def test_container_oom_timeout_and_zombies(container_sock) -> None:
    ctr, sock = container_sock
    c = ExecdClient(sock)
    try:
        await c.wait_ready(60)
        r = await c.exec(["python3", "-c", "b = bytearray(512 << 20)"], timeout=60)
        assert r.oom_killed and r.exit_code == 137 and not r.timed_out
        ok = await c.exec(["python3", "-c", "b = bytearray(1 << 20); print('fine')"], timeout=60)
        assert ok.stdout == "fine\n" and not ok.oom_killed
        # commands, then execd, and init (PID 1) last are the OOM killer's choices. A command
        # is forked with its score, so its first child (cat, forked by sh at once) has it too;
        # execd holds that score only while it forks, then goes back to its own.
        own_score = ('cat /proc/self/oom_score_adj /proc/1/oom_score_adj; for i in $(seq 100); do '
                     's=$(cat /proc/$PPID/oom_score_adj); [ "$s" = 100 ] && break; sleep 0.05; done; echo "$s"')
        for _ in range(20):
            adj = await c.exec(["sh", "-c", own_score], timeout=20)
            assert adj.stdout.split() == ["500", "0", "100"]
        r = await c.exec(["sh", "-c", "sleep 300 & sleep 300"], timeout=1)
        assert r.timed_out and r.exit_code == 124
        left = await c.exec(["sh", "-c", "ps -eo stat=,args= | grep -c '[s]leep 300' || true"], timeout=20)
        assert left.stdout.strip() == "0"
        # orphans re-parented to init (PID 1) are reaped once they exit
        await c.exec(["sh", "-c", "(sleep 0.2 &) ; true"], timeout=20)
        await c.exec(["sleep", "1"], timeout=20)  # the orphan has exited by now
        for _ in range(100):
            z = await c.exec(["sh", "-c", "ps -eo stat=,ppid=,args= | grep '^Z' || true"], timeout=20)
            if not z.stdout.strip():
                break
            await anyio.sleep(0.1)
        assert z.stdout.strip() == ""
    finally:
        await c.aclose()


@pytest.mark.docker
async def test_init_starts_a_killed_execd_again() -> None:
    """execd as PID 1 is the container's init: a SIGKILL of the serving execd, from inside
    the sandbox with a request in flight or from the host, costs that request (a typed
    error), not the sandbox: init starts execd again on the same socket, files and
    background processes stay, pooled connections are renewed. Code inside cannot signal
    init away (SIGKILL is not delivered to a namespace's init, SIGTERM from inside is
    ignored); a SIGTERM from outside (docker stop) ends it at once, exit 0."""
    engine = _engine()
    host_dir = _socket_dir()
    ctr = engine.containers.run(
        IMAGE, execd_command(ttl_s=600), detach=True, network_mode="none", read_only=True, tmpfs=TMPFS,
        user="1000", cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit="128m", memswap_limit="128m",
        pids_limit=256, volumes=execd_volumes(host_dir), labels={"sandgym.owner": "test-execd"},
    )  # fmt: skip
    c = ExecdClient(host_dir / "execd.sock")
    try:
        first = (await c.wait_ready(60))["pid"]
        await c.write_file("/workspace/acked.txt", b"acked")
        await c.exec(["sh", "-c", "sleep 601 >/dev/null 2>&1 &"], timeout=20)
        # from inside, with that very request in flight
        with pytest.raises(ExecdConnectionLost):
            await c.exec(["sh", "-c", f"kill -9 {first}; sleep 30"], timeout=60)
        second = (await c.wait_ready(30))["pid"]
        assert second not in (first, 1)
        assert await c.read_file("/workspace/acked.txt") == b"acked"
        ps = await c.exec(["ps", "-eo", "args="], timeout=20)
        assert "sleep 601" in ps.stdout, ps.stdout  # a background process of before the kill
        # signals from inside do not reach init
        for sig in ("KILL", "TERM", "INT"):
            r = await c.exec(["sh", "-c", f"kill -{sig} 1; echo sent $?"], timeout=20)
            assert r.stdout.startswith("sent"), r
        await anyio.sleep(0.5)
        assert (await c.ping())["pid"] == second
        ctr.reload()
        assert ctr.status == "running"
        # from the host, as the OOM killer would, with idle pooled connections left behind
        top = engine.api.top(ctr.id, ps_args="-o pid,ppid,args")["Processes"]
        host_init = next(int(p[0]) for p in top if "sandgym-execd/server.py" in p[2] and not any(q[0] == p[1] for q in top))
        host_execd = next(int(p[0]) for p in top if int(p[1]) == host_init and "sandgym-execd/server.py" in p[2])
        os.kill(host_execd, signal.SIGKILL)
        for _ in range(100):
            try:
                if (await c.ping())["pid"] != second:
                    break
            except SandboxGoneError:
                pass
            await anyio.sleep(0.1)
        assert (await c.exec(["cat", "/workspace/acked.txt"], timeout=20)).stdout == "acked"
        logs = ctr.logs().decode()
        assert logs.count("killed by signal 9; starting it again") == 2, logs
        # docker stop: SIGTERM from outside ends execd and init with it, exit 0
        ctr.stop(timeout=20)
        ctr.reload()
        assert ctr.attrs["State"]["ExitCode"] == 0, ctr.logs()
    finally:
        await c.aclose()
        ctr.remove(force=True)
        shutil.rmtree(host_dir, ignore_errors=True)


@pytest.mark.docker
async def test_execd_under_docker_init_and_ttl_removes_container() -> None:
    """With the engine's init (as the docker provider runs it) execd is not PID 1; its
    TTL ending the main process makes an auto-removed container vanish by itself."""
    engine = _engine()
    host_dir = _socket_dir()
    ctr = engine.containers.run(
        IMAGE,
        execd_command(ttl_s=4),
        detach=True,
        auto_remove=True,
        init=True,
        network_mode="none",
        read_only=True,
        tmpfs=TMPFS,
        user="1000",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        volumes=execd_volumes(host_dir),
        labels={"sandgym.owner": "test-execd"},
    )
    try:
        c = ExecdClient(host_dir / "execd.sock")
        info = await c.wait_ready(60)
        assert info["pid"] != 1
        assert (await c.exec(["sh", "-c", "echo ok"], timeout=20)).stdout == "ok\n"
        await c.aclose()
        gone = False
        for _ in range(600):
            try:
                engine.containers.get(ctr.id)
            except docker.errors.NotFound:
                gone = True
                break
            await anyio.sleep(0.1)
        assert gone
    finally:
        try:
            ctr.remove(force=True)
        except docker.errors.NotFound:
            pass
        shutil.rmtree(host_dir, ignore_errors=True)
