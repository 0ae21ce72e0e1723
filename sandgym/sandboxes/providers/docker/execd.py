"""execd (the in-sandbox exec daemon) as the docker provider's transport, and the host
socket directories.

A container that runs execd as its main process gets its own host directory, bind-mounted
read-write at /run/sandgym, where execd creates its socket (`execd_volumes` gives the mounts
in the Docker SDK's form). All such directories live under
one root (`SocketDirs`), named after the container, so `remove(id)` and a full listing (what
`prune` does) can delete those of containers that are gone. Once execd answers, the
directory is handed back to the host user (mode 0755): code in the sandbox runs under the
execd's uid and must not be able to replace the socket with one of its own.

`DockerExecdTransport` adds to the execd client what the docker provider promises beyond it:
- a timeout (or a cancelled call) also kills processes that left the command's process group
  (setsid, daemons), found by the `SANDGYM_EXEC_ID` token in their environment, as the
  docker-exec transport does;
- a request execd refused while the container still runs (the pids limit is full, so execd
  cannot start a thread for it: it answers `busy` without reading the request) is retried
  briefly and then reported as a failed command (exit 126), not as a vanished sandbox;
- execd killed mid-request (from inside the sandbox, by the OOM killer, from the host) while
  the container runs: its init starts it again, and the call raises `ExecdRestartedError`
  (the sandbox lives on; the command's leftovers are killed), never a vanished sandbox;
- `batch_exec` (many commands, one round trip) and `reset` (kill every process but init and
  execd, empty the workdir, /tmp and /dev/shm; execd's own op, a shell script for an older
  execd) for pooled reuse.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio

from ...base import python_argv
from ...errors import SandboxError, SandboxGoneError
from ...execd import (
    CONTAINER_EXECD_DIR,
    CONTAINER_SOCKET_DIR,
    EXECD_DIR,
    BatchJob,
    ExecdConnectionLost,
    ExecdRequestError,
    ExecdRestartedError,
    ExecdTransport,
    ExecdUnresponsiveError,
    ensure_bytecode,
)
from ...result import ExecResult
from .exec import _SWEEP, EXEC_ID_ENV
from .names import NAME, stale_entries

log = logging.getLogger(__name__)

_RETRIES = 6
_REFUSED_EXIT = 126
_RESTART_WAIT_S = 15.0  # how long a killed execd may take to answer again (python's start, under load)
_RESTART_POLL_S = 0.5  # how often that wait looks whether the container still runs
T = TypeVar("T")

# Kill everything but PID 1 (init), execd ($1) and this shell, a few passes in case some
# fork meanwhile; then empty the writable places. Shell builtins only on the common path
# (nothing running, nothing written): one process start per reset.
_RESET = r"""keep=" 1 $1 $$ "
pass=0
while [ $pass -lt 8 ]; do
  n=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$keep" in *" $p "*) continue ;; esac
    read -r st < "$d/stat" 2>/dev/null || continue
    case "${st##*) }" in Z*) continue ;; esac
    kill -KILL "$p" 2>/dev/null && n=$((n+1))
  done
  [ $n -eq 0 ] && break
  pass=$((pass+1))
done
shift
work=$1
for d in "$@"; do
  [ -d "$d" ] || continue
  set -- "$d"/* "$d"/.[!.]* "$d"/..?*
  for f in "$@"; do
    if [ -e "$f" ] || [ -L "$f" ]; then
      chmod -R u+rwX "$d"/. 2>/dev/null
      find "$d" -mindepth 1 -delete 2>/dev/null
      set -- "$d"/* "$d"/.[!.]* "$d"/..?*
      for g in "$@"; do
        if [ -e "$g" ] || [ -L "$g" ]; then echo "cannot empty $d: $g" >&2; exit 1; fi
      done
      break
    fi
  done
done
[ -O "$work" ] && chmod 0755 "$work" 2>/dev/null
exit 0"""


def execd_volumes(host_socket_dir: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """Docker SDK `volumes=`/`binds` entries: the socket directory (rw) and execd's code (ro)."""
    ensure_bytecode()
    return {
        str(host_socket_dir): {"bind": CONTAINER_SOCKET_DIR, "mode": "rw"},
        str(EXECD_DIR): {"bind": CONTAINER_EXECD_DIR, "mode": "ro"},
    }


def default_socket_root() -> Path:
    if os.geteuid() == 0:
        return Path("/run/sandgym-sockets")
    return Path(tempfile.gettempdir()) / f"sandgym-sockets-{os.geteuid()}"


class SocketDirs:
    """Per-container socket directories under one root."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_socket_root()

    @staticmethod
    def new_name() -> str:
        return f"sandgym-{uuid.uuid4().hex[:16]}"

    def make(self, name: str, uid: int, gid: int) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o711)
        d = self.root / name
        d.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(d, uid, gid)  # execd makes its socket here
        else:
            d.chmod(0o777)  # cannot give it away: open it up until execd is ready
        return d

    def seal(self, d: Path) -> None:
        """After execd bound its socket: the sandbox user may no longer change the dir."""
        if os.geteuid() == 0:
            os.chown(d, 0, 0)
        d.chmod(0o755)

    def owns(self, path: str | os.PathLike[str]) -> bool:
        p = Path(path)
        return p.parent == self.root and bool(NAME.match(p.name))

    def discard(self, path: str | os.PathLike[str]) -> None:
        if self.owns(path):
            shutil.rmtree(path, ignore_errors=True)

    def sweep(self, live_names: set[str]) -> list[str]:
        """Remove directories of containers that no longer exist (old enough not to be one
        being created right now). Returns the names removed."""
        removed: list[str] = []
        for e in stale_entries(self.root, live_names):
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.name)
        return removed


class DockerExecdTransport(ExecdTransport):
    """The execd client with the docker provider's kill and refusal semantics."""

    name = "execd"

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        container_running: Callable[[], Awaitable[bool]],
        grace_s: float = 10.0,
    ) -> None:
        super().__init__(socket_path, grace_s=grace_s)
        self._container_running = container_running
        self.execd_pid: int | None = None
        self._python_op = True  # until an older execd says it has no "python" op

    async def wait_ready(self, timeout: float = 30.0) -> None:
        info = await self.client.wait_ready(timeout)
        self.execd_pid = int(info["pid"])

    async def _survive(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn`; when execd died during it while the container runs on, wait for init
        to have started execd again and raise ExecdRestartedError (the sandbox is intact).
        A dead container, or an execd that does not come back, raises the loss as it was."""
        try:
            return await fn()
        except ExecdConnectionLost as exc:
            info = await self._restarted_execd()
            if info is None:
                raise
            if self.execd_pid is not None and int(info["pid"]) == self.execd_pid:
                raise ExecdRestartedError(f"the connection to execd broke during {what}, execd still runs; "
                                          f"whether {what} took effect is unknown: {exc}") from exc
            self.execd_pid = int(info["pid"])
            raise ExecdRestartedError(
                f"the sandbox's execd was killed during {what} and its init started it again: the sandbox, its "
                f"files and other processes are intact, but whether {what} took effect is unknown (a command "
                "it ran was killed)"
            ) from exc

    async def _restarted_execd(self) -> dict[str, Any] | None:
        """execd's ping once init has started it again; None when execd does not answer
        within _RESTART_WAIT_S or the container stops meanwhile. A gVisor OOM kill ends the
        connection a moment before the container is seen stopped: waiting out the whole
        bound reported it 15 s late, so the container is watched while execd is awaited."""
        ready: dict[str, Any] | None = None
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                # An engine that cannot say (dockerd restarting, live-restore keeping
                # containers up) is not a stop: watch on.
                while await self._running() is not False:
                    await anyio.sleep(_RESTART_POLL_S)
                tg.cancel_scope.cancel()

            async def wait() -> None:
                nonlocal ready
                try:
                    ready = await self.client.wait_ready(_RESTART_WAIT_S)
                except SandboxError:
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            tg.start_soon(wait)
        return ready

    async def _running(self) -> bool | None:
        """Whether the engine says the container runs; None when the engine does not answer
        (its own error is no answer to give the caller)."""
        try:
            return await self._container_running()
        except Exception as exc:
            log.debug("cannot tell whether the container runs: %r", exc)
            return None

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """Run `fn`, again while execd refuses it for want of a thread (`busy`) or a
        connection while the container runs; None when it kept refusing."""
        for attempt in range(_RETRIES):
            try:
                return await self._survive(what, fn)
            except ExecdRequestError as exc:
                if exc.code != "busy":
                    raise
            except (ExecdUnresponsiveError, ExecdConnectionLost):
                raise
            except SandboxGoneError:  # no connection to be had
                # Retried only while the engine says the container runs; an engine that cannot
                # say leaves the refusal as it is rather than a "busy" after every retry.
                if not await self._running():
                    raise
            log.debug("execd refused a request (attempt %d); container still runs", attempt)
            await anyio.sleep(0.05 * 2**attempt)
        return None

    async def write_file(self, path: str, data: bytes, mode: int) -> None:
        await self._survive("write_file", lambda: self.client.write_file(path, data, mode))

    async def read_file(self, path: str) -> bytes:
        return await self._survive("read_file", lambda: self.client.read_file(path))

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        await self._survive("put_archive", lambda: self.client.put_archive(dest_dir, tar_bytes))

    async def get_archive(self, path: str) -> bytes:
        return await self._survive("get_archive", lambda: self.client.get_archive(path))

    async def _sweep(self, tokens: Sequence[str]) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(15):
            for token in tokens:
                try:
                    await self.client.exec(["sh", "-c", _SWEEP, token], timeout=10, output_limit=4096)
                except Exception as exc:  # best effort, like the docker-exec sweep
                    log.debug("kill sweep failed: %r", exc)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        limit: int,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        token = uuid.uuid4().hex
        full_env = {**(env or {}), EXEC_ID_ENV: token}

        async def once() -> ExecResult:
            return await self.client.exec(
                list(argv), timeout=timeout, env=full_env, cwd=cwd, stdin=stdin, output_limit=limit
            )

        return await self._exec_call("exec", once, token, limit, cwd)

    async def exec_python(
        self,
        source: bytes,
        *,
        cpu_limit_s: int | None,
        timeout: float,
        limit: int,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """A Python program forked from execd's warm interpreter ("python" op); an execd from
        before that op runs `python3 -` as a command."""
        if self._python_op:
            token = uuid.uuid4().hex
            full_env = {**(env or {}), EXEC_ID_ENV: token}

            async def once() -> ExecResult:
                return await self.client.python(
                    source, cpu_limit_s=cpu_limit_s, timeout=timeout, env=full_env, cwd=cwd, output_limit=limit
                )

            try:
                return await self._exec_call("python", once, token, limit, cwd, unknown_op_raises=True)
            except ExecdRequestError as exc:
                if exc.code != "bad_request" or "unknown op" not in str(exc):
                    raise
                self._python_op = False  # an older execd (adopted across an upgrade)
        return await self.exec(python_argv(cpu_limit_s), timeout=timeout, limit=limit, env=env, cwd=cwd, stdin=source)

    async def _exec_call(
        self, what: str, once: Callable[[], Awaitable[ExecResult]], token: str, limit: int, cwd: str | None,
        *, unknown_op_raises: bool = False,
    ) -> ExecResult:
        """One command through `_call`, what it started swept when it ended badly; a refusal
        or a failed request is the command's failure (it may have run: no retry)."""
        started = time.monotonic()
        try:
            res = await self._call(what, once)
        except ExecdRestartedError:
            await self._sweep([token])  # what it started may still run under init
            raise
        except ExecdRequestError as exc:
            if unknown_op_raises and exc.code == "bad_request" and "unknown op" in str(exc):
                raise  # nothing ran
            # execd took the request but failed it (e.g. no thread to be had under a
            # full pids limit); the command may have run, so no retry: report it as failed.
            await self._sweep([token])
            return _refused(time.monotonic() - started, limit, str(exc))
        except BaseException:
            await self._sweep([token])  # cancelled or broken: leave nothing of it running
            raise
        if res is None:
            return _refused(time.monotonic() - started, limit)
        if res.timed_out:
            await self._sweep([token])
        if (
            cwd and res.exit_code == 127 and res.stderr_bytes.startswith(b"sandgym-execd: cannot run")
            and f"'{cwd}'".encode() in res.stderr_bytes
        ):
            # A missing cwd, not a missing program: 126, as docker exec (and a shell) say it.
            res = res.model_copy(update={"exit_code": 126})
        return res

    async def batch_exec(
        self, jobs: Sequence[BatchJob], *, parallel: int | None = None
    ) -> list[ExecResult]:
        """Many commands in one round trip, each with its own timeout and result."""
        tokens = [uuid.uuid4().hex for _ in jobs]
        tagged = [
            BatchJob(
                argv=j.argv, timeout=j.timeout, stdin=j.stdin, cwd=j.cwd,
                env={**(j.env or {}), EXEC_ID_ENV: t}, output_limit=j.output_limit,
            )
            for j, t in zip(jobs, tokens, strict=True)
        ]
        try:
            results = await self._call("batch_exec", lambda: self.client.batch_exec(tagged, parallel=parallel))
            if results is None:  # unlike one command, a batch is not a program's own failure
                raise ExecdRequestError("busy", f"execd refused the batch {_RETRIES} times while the container ran")
        except BaseException:
            await self._sweep(tokens)
            raise
        late = [t for t, r in zip(tokens, results, strict=True) if r.timed_out]
        if late:
            await self._sweep(late)
        return results

    async def reset(self, workdir: str) -> ExecResult:
        """Kill every process but init and execd; empty `workdir`, /tmp and /dev/shm. execd
        does it itself (no process started); an execd from before its `reset` op (a sandbox
        adopted across an upgrade) runs the same steps as a shell script."""
        started = time.monotonic()
        try:
            await self._survive("reset", lambda: self.client.reset([workdir, "/tmp", "/dev/shm"], workdir))
            return ExecResult(exit_code=0, duration_s=time.monotonic() - started)
        except ExecdRestartedError as exc:  # not known to be clean: not for another user
            return ExecResult(exit_code=1, stderr_bytes=str(exc).encode(), duration_s=time.monotonic() - started)
        except ExecdRequestError as exc:
            if exc.code != "bad_request" or "unknown op" not in str(exc):
                return ExecResult(exit_code=1, stderr_bytes=str(exc).encode(), duration_s=time.monotonic() - started)
        if self.execd_pid is None:
            await self.wait_ready(10)
        return await self.client.exec(
            ["/bin/sh", "-c", _RESET, "sh", str(self.execd_pid), workdir, "/tmp", "/dev/shm"],
            timeout=60, output_limit=1 << 16,
        )


def _refused(duration: float, limit: int, why: str = "") -> ExecResult:
    msg = "sandgym: the sandbox's execd could not run the command (is the pids limit reached?)"
    msg += f": {why}\n" if why else "\n"
    return ExecResult(
        exit_code=_REFUSED_EXIT, stderr_bytes=msg.encode(), duration_s=duration, output_limit=limit
    )
