"""Running one command of a local sandbox: spawn (in the sandbox's cgroups, under its
rlimits, as its uid), stream both outputs into capped buffers, kill on timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import SandboxError
from ...execd.capped import CappedBuffer
from ...result import TIMEOUT_EXIT, ExecResult
from .probe import bwrap_child_pid

_CHUNK = 1 << 16
# After the command exits, how long we keep reading output that background processes
# (which inherited the pipes) may still be writing. Under bwrap they die with the command.
_DRAIN_GRACE_S = 0.5


@dataclass(frozen=True)
class Launch:
    """How to start processes of one sandbox (fixed at create time)."""

    procs_files: tuple[str, ...]  # cgroup.procs files to join before exec
    rlimits: tuple[tuple[int, int, int], ...]  # (resource, soft, hard)
    uid: int | None  # host uid to switch to (None: stay who we are)
    gid: int | None

    def preexec(self, cpu_limit_s: int) -> Callable[[], None]:
        # Runs in the forked child before exec: only plain syscalls, no imports, no locks.
        procs_files, rlimits, uid = self.procs_files, self.rlimits, self.uid
        gid = self.gid if self.gid is not None else uid  # no gid of its own: the uid's group

        def pre() -> None:
            for p in procs_files:
                fd = os.open(p, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            for res, soft, hard in rlimits:
                resource.setrlimit(res, (soft, hard))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit_s, cpu_limit_s + 5))
            if uid is not None and gid is not None:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)

        return pre


async def _pump(stream: asyncio.StreamReader, buf: CappedBuffer) -> None:
    # Keep reading past the cap (discarding) so the writer never blocks on a full pipe.
    while chunk := await stream.read(_CHUNK):
        buf.write(chunk)


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
        stdin.close()
        await stdin.wait_closed()


async def _pidfd_exited(fd: int) -> None:
    """Until the process of pidfd `fd` has exited (readable from then on, reaped or not)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def exited() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, exited)
    try:
        await done
    finally:
        loop.remove_reader(fd)


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the process itself has exited. `proc.wait()` on Python < 3.12 also waits for
    its pipes to close, so a background child still holding stdout would stall it until
    the timeout: wait on a pidfd instead (the drain grace below bounds the rest)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel), or already exited and reaped
        fd = -1
    if fd >= 0:
        try:
            await _pidfd_exited(fd)
        finally:
            os.close(fd)
    elif not hasattr(os, "pidfd_open"):
        await proc.wait()
        return
    while proc.returncode is None:  # the child watcher reaps it a moment later
        await asyncio.sleep(0.001)


def _is_namespace_init(pid: int) -> bool:
    """Whether `pid` is pid 1 of its own pid namespace (its innermost NSpid), as bwrap's is."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return line.split()[-1] == "1"
    except OSError:
        return False
    return False


async def namespace_ended(info_fd: int, bound_s: float) -> None:
    """Until the pid namespace that bwrap reported on `info_fd` (its --info-fd, read once
    bwrap has exited) has ended. bwrap exits with the command's status as soon as its pid 1
    passes it on, while that pid 1 is still killing the namespace's other processes (a
    command's background jobs) and waiting for them; it exits only once they are gone.
    Bounded by `bound_s`: nothing we can do hangs on it."""
    try:
        os.set_blocking(info_fd, False)
        pid = bwrap_child_pid(os.read(info_fd, 1 << 16))
        if pid is None:
            return  # bwrap failed before it started its pid 1
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return  # nothing written, already gone and reaped, or no pidfd on this kernel
    if not _is_namespace_init(pid):  # reaped, and its number taken by another process
        os.close(fd)
        return
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_pidfd_exited(fd), bound_s)
    finally:
        os.close(fd)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_process(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: str,
    stdin: bytes | None,
    timeout: float,
    limit: int,
    launch: Launch,
    cpu_limit_s: int,
    oom_counter: Callable[[], int | None] | None = None,
    running: set[int] | None = None,
    pass_fds: Sequence[int] = (),
) -> ExecResult:
    """Run `argv` to completion or `timeout`; never raises for a failing command."""
    out, err = CappedBuffer(limit), CappedBuffer(limit)
    oom_before = oom_counter() if oom_counter else None
    start = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own process group, killed as one on timeout
            preexec_fn=launch.preexec(cpu_limit_s),
            close_fds=True,
            pass_fds=pass_fds,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxError(f"could not start {argv[0]!r} in the sandbox: {e}") from e
    assert proc.stdout is not None and proc.stderr is not None
    if running is not None:
        running.add(proc.pid)  # its process group id too (start_new_session)
    tasks = [asyncio.ensure_future(_pump(proc.stdout, out)), asyncio.ensure_future(_pump(proc.stderr, err))]
    if stdin is not None:
        assert proc.stdin is not None
        tasks.append(asyncio.ensure_future(_feed(proc.stdin, stdin)))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(_exited(proc), timeout)
        except TimeoutError:
            timed_out = True
            # The process group holds the command (and, under bwrap, the namespace's init,
            # whose death takes every process in the pid namespace with it).
            _killpg(proc.pid)
            await _exited(proc)  # not proc.wait(): setsid() escapees may hold the pipes
        _, pending = await asyncio.wait(tasks, timeout=_DRAIN_GRACE_S)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    except BaseException:
        # Cancelled (or anything else): leave nothing running behind us.
        _killpg(proc.pid)
        for t in tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    finally:
        if running is not None:
            running.discard(proc.pid)
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()  # closes pipes still held open by stray background processes
    duration = time.monotonic() - start
    rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    exit_code = 128 - rc if rc < 0 else rc
    oom = False
    if oom_counter is not None and oom_before is not None:
        after = oom_counter()
        oom = after is not None and after > oom_before
    if timed_out:
        exit_code = TIMEOUT_EXIT
    return ExecResult(
        exit_code=exit_code,
        stdout_bytes=out.getvalue(),
        stderr_bytes=err.getvalue(),
        duration_s=duration,
        timed_out=timed_out,
        oom_killed=oom and not timed_out,
        truncated=out.truncated or err.truncated,
        output_limit=limit,
    )
