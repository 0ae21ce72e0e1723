"""`DockerExecTransport`: commands and files through the Docker exec API.

One `docker exec` per command. The command runs under coreutils `timeout -s KILL`, which
puts itself and the command in a fresh process group and, at the deadline, kills the whole
group with one kill(2) -- no fork needed, so it works even when a fork bomb has used up the
pids limit. Every exec also carries a unique `SANDGYM_EXEC_ID` in its environment; after a
timeout (or when the caller cancels) a second exec kills every process still carrying it,
which catches children that left the group (setsid, daemonizing). A host-side deadline is
the backstop when the in-sandbox timer does not end the stream (no `timeout` binary, a
frozen container): the driver never waits much past the deadline.

Files go through exec too (`cat`, `tar`), because Docker's archive API refuses a read-only
root file system ("container rootfs is marked read-only") and cannot see tmpfs mounts, which
is where a hardened sandbox keeps its writable space. Running them as the container's user
makes everything written owned by the sandbox user.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

import anyio
import docker
import docker.errors
from anyio import to_thread

from ...errors import SandboxError, SandboxFileNotFound, SandboxGoneError
from ...execd.capped import CappedBuffer
from ...result import TIMEOUT_EXIT, ExecResult
from .demux import AttachStream, Demux

log = logging.getLogger(__name__)

EXEC_ID_ENV = "SANDGYM_EXEC_ID"
KILLED_EXIT = 137
# After the in-sandbox timer should have fired, how long the host waits before killing itself.
_BACKSTOP_S = 1.0
# After a kill, how long to keep reading for the rest of the output before dropping the stream.
_DRAIN_S = 2.0
# Silence after which we ask the engine whether the command already exited (its output pipe
# can be held open by a background child, e.g. `server &`).
_IDLE_POLL_S = 0.5
_BUSY_POLL_S = 2.0
# Once the main process has exited: read on until this much silence (or _DRAIN_S in all).
_DRAIN_QUIET_S = 0.2
# Once nothing of the command is left: how long its stream may take to end (a loaded engine).
_EOF_WAIT_S = 10.0
_MISSING = 3  # exit code our file helpers use for "no such file"
_IS_DIR = 4

# Kill every process whose environment carries the token, a few passes in case some fork
# meanwhile. Shell + grep only, so it works in any image with a POSIX userland.
_SWEEP = r"""t="$0"; pass=0
while [ $pass -lt 5 ]; do
  n=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    if grep -qsF "SANDGYM_EXEC_ID=$t" "$d/environ" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null && n=$((n+1))
    fi
  done
  [ $n -eq 0 ] && break
  pass=$((pass+1))
done
exit 0"""

# Exit 0 when a process carries the token, 1 when none does.
_HELD = r"""for d in /proc/[0-9]*; do
  [ "${d#/proc/}" = "$$" ] && continue
  grep -qsF "SANDGYM_EXEC_ID=$0" "$d/environ" 2>/dev/null && exit 0
done
exit 1"""

_WRITE = 'set -e; mkdir -p -- "$(dirname -- "$1")"; cat > "$1"; chmod "$2" "$1"'
_READ = '[ -e "$1" ] || exit 3; [ -d "$1" ] && exit 4; exec cat -- "$1"'
_PUT = 'mkdir -p -- "$1" && exec tar -C "$1" -o -xf -'
_GET = (
    '[ -e "$1" ] || [ -L "$1" ] || exit 3; '
    'cd -- "$(dirname -- "$1")" && exec tar -cf - -- "$(basename -- "$1")"'
)

_OCI_PREFIX = b"OCI runtime exec failed"


class DockerExecTransport:
    """Exec and file transfer for one container through the Docker exec API."""

    name = "docker-exec"

    def __init__(
        self,
        api: docker.APIClient,
        container_id: str,
        *,
        limiter: anyio.CapacityLimiter | None = None,
        file_timeout_s: float = 600.0,
        max_file_bytes: int = 1 << 30,
    ) -> None:
        self.api = api
        self.container_id = container_id
        self.limiter = limiter
        self.file_timeout_s = file_timeout_s
        self.max_file_bytes = max_file_bytes
        # False once an image turns out to have no `timeout` binary: host deadline only.
        self.use_timeout_wrapper = True

    # -- exec ---------------------------------------------------------------------------

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
        cancel = threading.Event()
        try:
            return await to_thread.run_sync(
                self._exec_blocking, list(argv), timeout, limit, dict(env or {}), cwd, stdin,
                cancel, abandon_on_cancel=True, limiter=self.limiter,
            )
        except anyio.get_cancelled_exc_class():
            cancel.set()  # the worker thread kills the command's processes and returns
            raise

    def _exec_blocking(
        self,
        argv: list[str],
        timeout: float,
        limit: int,
        env: dict[str, str],
        cwd: str | None,
        stdin: bytes | None,
        cancel: threading.Event,
        wrap: bool | None = None,
    ) -> ExecResult:
        caller_path = "PATH" in env
        token = uuid.uuid4().hex
        env[EXEC_ID_ENV] = token
        timeout = max(timeout, 0.001)  # `timeout 0` would mean "no limit"
        started = time.monotonic()
        wrapped = self.use_timeout_wrapper if wrap is None else wrap
        full = ["timeout", "-s", "KILL", f"{timeout:.3f}", *argv] if wrapped else argv
        exec_id, stream = self._start(full, env, cwd, stdin)
        out, err = CappedBuffer(limit), CappedBuffer(limit)
        demux = Demux()

        def feed(chunk: bytes) -> None:
            for kind, data in demux.feed(chunk):
                (out if kind == "stdout" else err).write(data)

        killed = False
        try:
            # Drain the buffered reader before the stdin writer starts (see take_buffered).
            feed(stream.take_buffered())
            if stdin is not None:
                stream.send_stdin(stdin)
            deadline = started + timeout + (_BACKSTOP_S if wrapped else 0.0)
            last_data = last_poll = time.monotonic()
            exited_at: float | None = None
            held = True
            while True:
                now = time.monotonic()
                if not killed and (now >= deadline or cancel.is_set()):
                    self._sweep(token)
                    killed = True
                    deadline = time.monotonic() + _DRAIN_S
                    continue
                if killed and now >= deadline:
                    break  # something outside our reach holds the stream; give up on it
                if exited_at is not None and (
                    (held and now - last_data >= _DRAIN_QUIET_S)
                    or now - exited_at >= (_DRAIN_S if held else _EOF_WAIT_S)
                ):
                    break  # exited, and what it left in flight has arrived
                wait = _DRAIN_QUIET_S if exited_at is not None else _IDLE_POLL_S
                chunk = stream.recv(min(deadline - now, wait))
                if chunk == b"":
                    break
                if chunk:
                    last_data = time.monotonic()
                    feed(chunk)
                now = time.monotonic()
                # The stream ends when the last holder of the command's stdout exits, which
                # may be a background child (`server &`). The command is over when its main
                # process is; ask the engine after a silence, or now and then under output.
                if exited_at is None and (
                    now - last_data >= _IDLE_POLL_S or now - last_poll >= _BUSY_POLL_S
                ):
                    last_poll = now
                    if not self._running(exec_id):
                        exited_at = now
                        # Nothing of the command's left holding its output: the stream's end
                        # is on its way (late on a loaded machine: wait for it, or the output
                        # is lost under exit 0). A background child holding it: a quiet
                        # spell is the end.
                        held = self._held(token)
        finally:
            stream.close()
        code = self._exit_code(exec_id)
        duration = time.monotonic() - started
        timed_out = killed or (wrapped and code == KILLED_EXIT and duration >= timeout)
        if timed_out and not killed:
            self._sweep(token)  # the group is dead; children that left it may not be
        stdout, stderr = out.getvalue(), err.getvalue()
        if code == 126 and stdout.startswith(_OCI_PREFIX):
            # The engine could not start the process; say it the way a shell would.
            if wrapped and b'"timeout": executable file not found' in stdout:
                if not caller_path:  # the image has none (not just this call's PATH)
                    self.use_timeout_wrapper = False
                return self._exec_blocking(argv, timeout, limit, env, cwd, stdin, cancel, False)
            stdout, stderr = b"", stdout
            if b"chdir to cwd" not in stderr and (
                b"executable file not found" in stderr or b"no such file or directory" in stderr
            ):
                code = 127
        return ExecResult(
            exit_code=TIMEOUT_EXIT if timed_out else code,
            stdout_bytes=stdout,
            stderr_bytes=stderr,
            duration_s=duration,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
            output_limit=limit,
        )

    def _start(
        self, argv: list[str], env: dict[str, str], cwd: str | None, stdin: bytes | None
    ) -> tuple[str, AttachStream]:
        try:
            exec_id = self.api.exec_create(
                self.container_id, argv, stdout=True, stderr=True, stdin=stdin is not None,
                environment=[f"{k}={v}" for k, v in env.items()], workdir=cwd,
            )["Id"]
            stream = AttachStream(self.api.exec_start(exec_id, socket=True))
        except docker.errors.NotFound as e:
            raise SandboxGoneError(f"container {self.container_id[:12]} is gone") from e
        except docker.errors.APIError as e:
            if e.status_code == 409:  # "is not running" / "is paused"
                msg = f"container {self.container_id[:12]}: {e.explanation}"
                raise SandboxGoneError(msg) from e
            raise SandboxError(f"docker exec failed: {e.explanation or e}") from e
        return exec_id, stream

    def _running(self, exec_id: str) -> bool:
        try:
            return bool(self.api.exec_inspect(exec_id).get("Running"))
        except docker.errors.APIError:
            return False

    def _exit_code(self, exec_id: str) -> int:
        # The stream can end a moment before the engine records the exit code.
        for _ in range(100):
            try:
                info = self.api.exec_inspect(exec_id)
            except docker.errors.NotFound as e:
                raise SandboxGoneError(f"container {self.container_id[:12]} is gone") from e
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        return KILLED_EXIT if info.get("ExitCode") is None else int(info["ExitCode"])

    def _held(self, token: str) -> bool:
        """Whether a process carrying `token` still runs (true when that cannot be told)."""
        try:
            exec_id = self.api.exec_create(self.container_id, ["sh", "-c", _HELD, token])["Id"]
            self.api.exec_start(exec_id)
            return self._exit_code(exec_id) != 1
        except docker.errors.APIError:
            return True

    def _sweep(self, token: str) -> None:
        """Kill every process carrying `token` (best effort; the pids limit may refuse)."""
        for attempt in range(3):
            try:
                exec_id = self.api.exec_create(self.container_id, ["sh", "-c", _SWEEP, token])["Id"]
                self.api.exec_start(exec_id)
                return
            except docker.errors.NotFound:
                return  # container gone: nothing left to kill
            except docker.errors.APIError as e:
                log.debug("kill sweep attempt %d failed: %s", attempt, e)
                time.sleep(0.1)

    # -- files --------------------------------------------------------------------------

    async def _helper(self, script: str, *args: str, stdin: bytes | None = None) -> ExecResult:
        return await self.exec(
            ["sh", "-c", script, "sh", *args], timeout=self.file_timeout_s,
            limit=self.max_file_bytes, stdin=stdin,
        )

    @staticmethod
    def _check(res: ExecResult, what: str, path: str) -> None:
        if res.exit_code == _MISSING:
            raise SandboxFileNotFound(path)
        if res.exit_code == _IS_DIR:
            raise SandboxError(f"{what} {path!r}: is a directory")
        if res.truncated:
            raise SandboxError(f"{what} {path!r}: larger than {res.output_limit} bytes")
        if not res.ok:
            raise SandboxError(f"{what} {path!r} failed ({res.exit_code}): {res.stderr.strip()}")

    async def write_file(self, path: str, data: bytes, mode: int) -> None:
        res = await self._helper(_WRITE, path, format(mode & 0o7777, "o"), stdin=data)
        self._check(res, "write", path)

    async def read_file(self, path: str) -> bytes:
        res = await self._helper(_READ, path)
        self._check(res, "read", path)
        return res.stdout_bytes

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        res = await self._helper(_PUT, dest_dir, stdin=tar_bytes)
        self._check(res, "extract into", dest_dir)

    async def get_archive(self, path: str) -> bytes:
        res = await self._helper(_GET, path)
        self._check(res, "archive", path)
        return res.stdout_bytes

    async def aclose(self) -> None:
        return None  # connections belong to the provider's client
