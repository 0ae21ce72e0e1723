"""Host-side async client for execd, the in-sandbox exec daemon (daemon.py, same folder).

Running execd in a container (what a provider does; providers/docker/execd.py is the
docker provider's wiring):

- Host directory for the socket: a fresh per-sandbox directory that the container user can
  create files in, since execd (uid 1000 in sandgym/python) makes the socket there:
  `os.chown(d, 1000, 1000); os.chmod(d, 0o700)` when the host side runs as root (root
  still connects), else `os.chmod(d, 0o777)`. Mount it read-write at `CONTAINER_SOCKET_DIR`
  (/run/sandgym). The socket itself is created 0777.
- execd's code: mount `EXECD_DIR` (this package's folder) read-only at
  `CONTAINER_EXECD_DIR` (/opt/sandgym-execd). Works with a read-only root, network none,
  cap_drop ALL, no-new-privileges.
- Command (the container's main process, with no docker-init: the container ends when
  execd ends itself, at its TTL or when its owner is gone): `execd_command(ttl_s)` =
  `python3 -I -S /opt/sandgym-execd/server.py --socket /run/sandgym/execd.sock --ttl <ttl_s>`
  (server.py imports daemon.py, from the `.pyc` that `ensure_bytecode()` makes: call it before
  mounting). As PID 1 execd is the container's init: it reaps orphans, holds the socket, and
  starts the serving execd again when that is killed (daemon.py `init`). The container's env and
  working directory become every command's defaults.
- Owner lifeline (optional): a FIFO in the socket directory that only the owning process
  holds open for writing (`ownership.Lifeline.fifo`); `execd_command(ttl_s,
  owner_fifo=f"{CONTAINER_SOCKET_DIR}/{LIFELINE_NAME}", owner_grace_s=g)` makes execd end
  itself `g` seconds after that process is gone.
- Readiness: `await ExecdClient(host_dir / "execd.sock").wait_ready(timeout)`; the socket
  appears only once execd accepts (it is bound under a temporary name and renamed).
- Use: `ExecdTransport(sock)` (transport.py) has the shape of a container provider's
  transport (providers/docker/transport.Transport); or directly
  `await client.exec(["python3", "-c", "print(1)"], timeout=10)` -> `ExecResult`;
  `batch_exec([BatchJob(argv=..., timeout=...), ...])` runs many in one round trip;
  `read_file`, `write_file`, `put_archive`, `get_archive`; a live process (stdin, output
  as it comes, signals; it outlives this client, which can attach to it again) is
  `ExecdLiveProcess(client, argv)` (live.py); finally
  `await client.aclose()`.

Errors: a connection that cannot be made raises `SandboxGoneError`; one that breaks
mid-request raises `ExecdConnectionLost` (a `SandboxGoneError`: execd died during it; when
the container's init started execd again, the provider reports `ExecdRestartedError`); no
answer within the request's own timeout plus `grace_s` raises `ExecdUnresponsiveError` (a
`SandboxGoneError`); execd refusing a request it had no thread for raises
`ExecdRequestError` with code `busy` (it did not run). Closing a connection mid-request (cancellation, deadline) makes
execd kill that request's commands. Use a client from one event loop at a time (its pool
is renewed when the loop changes).
"""

from __future__ import annotations

import functools
import json
import os
import select
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import SocketAttribute, SocketStream

from ..base import Command, as_bytes, shell_argv
from ..errors import (
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGoneError,
    SandboxInterruptedError,
)
from ..result import ExecResult
from . import framing

EXECD_DIR = Path(__file__).resolve().parent
SERVER_PATH = EXECD_DIR / "server.py"  # the script a sandbox runs: it imports daemon.py
CONTAINER_EXECD_DIR = "/opt/sandgym-execd"
CONTAINER_SOCKET_DIR = "/run/sandgym"
SOCKET_NAME = "execd.sock"
LIFELINE_NAME = "lifeline"  # the owner's FIFO, next to the socket
DEFAULT_OUTPUT_LIMIT = 1 << 20

BROKEN = (
    anyio.EndOfStream,
    anyio.IncompleteRead,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
    json.JSONDecodeError,  # a garbled frame
    framing.FrameError,
    struct.error,
)

OutputCallback = Callable[[str, bytes], Awaitable[None] | None]


EGRESS_PORT = 3128  # the relay's port inside a sandbox with egress (HTTP(S)_PROXY points here)
EGRESS_SOCKET_NAME = "egress.sock"


@functools.cache
def ensure_bytecode() -> None:
    """Write the `.pyc` of execd's modules for this Python next to them, where missing or
    stale, once per process: sandboxes mount the folder read-only and import from it on every
    start, where compiling daemon.py would cost each start about 17 ms (66 vs 49 ms). A sandbox whose
    python3 is another version compiles in memory, as before. A folder this user may not
    write (a system install, whose installer wrote them) is left as it is."""
    import compileall

    try:
        compileall.compile_dir(str(EXECD_DIR), maxlevels=0, quiet=2)
    except OSError:
        pass


def execd_command(
    ttl_s: float | None = None,
    socket_path: str | None = None,
    *,
    egress: bool = False,
    owner_fifo: str | None = None,
    owner_grace_s: float = 0.0,
) -> list[str]:
    """The container command that runs execd from its read-only mount; with `egress`, execd
    also relays 127.0.0.1:EGRESS_PORT to the egress socket next to its own; with `owner_fifo`
    it also ends `owner_grace_s` after the FIFO's last writer (the owner) is gone."""
    cmd = [
        "python3",
        "-I",
        "-S",  # stdlib only: no site (its .pth walk is a good part of a start under gVisor)
        f"{CONTAINER_EXECD_DIR}/{SERVER_PATH.name}",
        "--socket",
        socket_path or f"{CONTAINER_SOCKET_DIR}/{SOCKET_NAME}",
    ]
    if ttl_s:
        cmd += ["--ttl", str(float(ttl_s))]
    if egress:
        cmd += ["--egress-port", str(EGRESS_PORT), "--egress-socket", f"{CONTAINER_SOCKET_DIR}/{EGRESS_SOCKET_NAME}"]
    if owner_fifo:
        cmd += ["--owner-fifo", owner_fifo, "--owner-grace", str(float(owner_grace_s))]
    return cmd


class ExecdUnresponsiveError(SandboxGoneError):
    """execd did not answer within the request's deadline (timeout + grace)."""


class ExecdConnectionLost(SandboxGoneError):
    """The connection broke while execd had the request: execd died during it (the sandbox
    may be gone, or its init may have started execd again); whether the request took effect
    is unknown, so it is never retried here."""


class ExecdRestartedError(SandboxInterruptedError):
    """execd was killed while it had this request and its init started it again: the
    sandbox, its files and its other processes are intact; whether the request took effect
    is unknown (a command it ran was killed). Safe to retry what is idempotent."""


class ExecdRequestError(SandboxError):
    """execd refused or failed a request; `code` says why (e.g. is_a_directory)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message

    def __reduce__(self) -> tuple[type[ExecdRequestError], tuple[str, str]]:
        # It crosses processes as itself (a Ray node agent's error reaches the driver).
        return type(self), (self.code, self.detail)


@dataclass
class BatchJob:
    """One command of a batch_exec; each has its own timeout and result."""

    argv: Command
    timeout: float = 60.0
    stdin: bytes | str | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT


class Connection:
    """One connection to execd: frames out and in (one request at a time, or one live process)."""

    __slots__ = ("stream", "buf")

    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def _exactly(self, n: int) -> bytes:
        # Large payloads are read in up-to-1-MiB receives (anyio's buffered stream takes
        # 64 KiB at a time, which halves read_file throughput).
        buf = self.buf
        while len(buf) < n:
            buf += await self.stream.receive(min(max(n - len(buf), 1 << 16), 1 << 20))
        data = bytes(buf[:n])
        del buf[:n]
        return data

    async def send(self, header: dict[str, Any], blobs: Sequence[bytes]) -> None:
        for piece in framing.encode(header, blobs):
            await self.stream.send(piece)

    async def recv(self) -> tuple[dict[str, Any], list[bytes]]:
        n = framing.header_size(await self._exactly(framing.LEN.size))
        header = framing.decode_header(await self._exactly(n))
        blobs = [await self._exactly(k) if k else b"" for k in framing.blob_sizes(header)]
        return header, blobs

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except Exception:
                pass

    def abandon(self) -> None:
        """Close the socket of a connection whose event loop is gone."""
        try:
            self.stream.extra(SocketAttribute.raw_socket).close()
        except Exception:
            pass


class ExecdClient:
    """Talks to one execd over its unix socket, keeping a small pool of idle connections
    (one request in flight per connection; concurrency opens more)."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        grace_s: float = 10.0,
        max_idle: int = 8,
    ) -> None:
        self.socket_path = str(socket_path)
        self.grace_s = grace_s
        self.max_idle = max_idle
        self._idle: list[Connection] = []
        self._closed = False
        self._loop: object = None  # the event loop the pooled connections belong to

    # ------------------------------------------------------------------ transport

    async def _connect(self) -> Connection:
        if self._closed:
            raise SandboxGoneError("execd client is closed")
        try:
            return Connection(await anyio.connect_unix(self.socket_path))
        except OSError as exc:
            raise SandboxGoneError(f"execd at {self.socket_path} is unreachable: {exc}") from exc

    async def _request(
        self,
        header: dict[str, Any],
        blobs: Sequence[bytes] = (),
        *,
        deadline_s: float,
        on_event: Callable[[dict[str, Any], list[bytes]], Awaitable[None]] | None = None,
    ) -> tuple[dict[str, Any], list[bytes]]:
        loop = anyio.lowlevel.current_token()
        # A second anyio.run(): asyncio's unix streams would survive the move, but a stream
        # is not promised to outlive its loop, so start a fresh pool.
        if loop != self._loop:
            for stale in self._idle:
                stale.abandon()
            self._idle, self._loop = [], loop
        conn = self._pooled() or await self._connect()
        reusable = False
        try:
            with anyio.fail_after(deadline_s):
                await conn.send(header, blobs)
                while True:
                    reply, rblobs = await conn.recv()
                    if "event" not in reply:
                        break
                    if on_event is not None:
                        await on_event(reply, rblobs)
            reusable = True
        except TimeoutError as exc:
            raise ExecdUnresponsiveError(
                f"execd at {self.socket_path} gave no answer to {header.get('op')!r} in {deadline_s:.1f}s"
            ) from exc
        except BROKEN as exc:
            raise ExecdConnectionLost(
                f"execd at {self.socket_path} went away during {header.get('op')!r}: {exc!r}"
            ) from exc
        finally:
            if reusable and not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
            else:  # mid-request state unknown (or surplus): closing it also cancels the work
                await conn.aclose()
        if not reply.get("ok"):
            err = reply.get("error") or {}
            code, message = str(err.get("code", "internal")), str(err.get("message", ""))
            if code == "not_found":
                raise SandboxFileNotFound(message)
            raise ExecdRequestError(code, message)
        return reply, rblobs

    def _pooled(self) -> Connection | None:
        """An idle connection whose execd is still there. An idle connection has nothing to
        read, so a readable one has met end-of-file: its execd died (and was perhaps started
        again, taking new connections); sending on it would fail a request that never ran."""
        while self._idle:
            conn = self._idle.pop()
            try:
                dead = bool(select.select([conn.stream.extra(SocketAttribute.raw_socket)], [], [], 0)[0])
            except (OSError, ValueError, anyio.TypedAttributeLookupError):
                dead = True
            if not dead and not conn.buf:
                return conn
            conn.abandon()
        return None

    async def connect(self) -> Connection:
        """A connection of its own, outside the pool (a live process holds one for its
        lifetime; see live.py). Raises SandboxGoneError when execd cannot be reached."""
        return await self._connect()

    # ------------------------------------------------------------------ operations

    async def ping(self, timeout: float = 5.0) -> dict[str, Any]:
        """execd's pid, uid, python version and remaining TTL."""
        reply, _ = await self._request({"op": "ping"}, deadline_s=timeout)
        return reply

    async def wait_ready(self, timeout: float = 30.0, interval: float = 0.02) -> dict[str, Any]:
        """Poll until execd answers a ping; raises SandboxCreateError past `timeout`."""
        last: Exception | None = None
        with anyio.move_on_after(timeout):
            while True:
                try:
                    return await self.ping(timeout=max(1.0, interval * 10))
                except SandboxGoneError as exc:
                    last = exc
                await anyio.sleep(interval)
                interval = min(interval * 1.5, 0.25)
        raise SandboxCreateError(f"execd at {self.socket_path} not ready after {timeout}s: {last}")

    async def exec(
        self,
        argv: Command,
        *,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Run one command. `on_output(stream, chunk)` (optional, sync or async) sees output
        as it arrives ("stdout"/"stderr"), up to the cap. `timeout=None` means 60 s."""
        timeout = 60.0 if timeout is None else timeout
        header = _job_header(argv, timeout, env, cwd, stdin is not None, output_limit)
        blobs = [as_bytes(stdin)] if stdin is not None else []
        header["op"] = "exec"
        on_event = None
        if on_output is not None:
            header["stream"] = True

            async def on_event(ev: dict[str, Any], evblobs: list[bytes]) -> None:
                res = on_output(str(ev.get("stream")), evblobs[0] if evblobs else b"")
                if res is not None:
                    await res

        reply, (out, err) = await self._request(
            header, blobs, deadline_s=timeout + self.grace_s, on_event=on_event
        )
        return _to_result(reply["result"], out, err, output_limit)

    async def python(
        self,
        source: bytes | str,
        *,
        cpu_limit_s: int | None = None,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        """Run a Python program as `python3 -` with it on stdin would, under RLIMIT_CPU of
        `cpu_limit_s`: forked from execd's warm interpreter (a fork, not an interpreter
        start), or a fresh one where that would behave differently (daemon.py's run_python).
        An execd from before this op raises ExecdRequestError ("bad_request", unknown op)."""
        timeout = 60.0 if timeout is None else timeout
        header = _job_header(["python3", "-"], timeout, env, cwd, True, output_limit)
        header["op"] = "python"
        if cpu_limit_s:
            header["cpu_limit_s"] = int(cpu_limit_s)
        reply, (out, err) = await self._request(header, [as_bytes(source)], deadline_s=timeout + self.grace_s)
        return _to_result(reply["result"], out, err, output_limit)

    async def batch_exec(
        self, jobs: Sequence[BatchJob | Mapping[str, Any]], *, parallel: int | None = None
    ) -> list[ExecResult]:
        """Run many commands in one round trip, at most `parallel` at once inside the sandbox
        (default: its CPU count); results in job order."""
        specs = [j if isinstance(j, BatchJob) else BatchJob(**j) for j in jobs]
        if not specs:
            return []
        blobs: list[bytes] = []
        headers = []
        for j in specs:
            h = _job_header(j.argv, j.timeout, j.env, j.cwd, False, j.output_limit)
            if j.stdin is not None:
                h["stdin"] = len(blobs)
                blobs.append(as_bytes(j.stdin))
            headers.append(h)
        header: dict[str, Any] = {"op": "batch_exec", "jobs": headers}
        if parallel:
            header["parallel"] = int(parallel)
        # Greedy scheduling finishes within sum/P + max; unknown P counts as 1.
        per_job = [j.timeout + 2.5 for j in specs]
        p = max(1, min(parallel or 1, len(specs)))
        deadline = sum(per_job) / p + max(per_job) + self.grace_s
        reply, rblobs = await self._request(header, blobs, deadline_s=deadline)
        results = []
        for i, (fields, j) in enumerate(zip(reply["results"], specs, strict=True)):
            if "error" in fields:
                err = fields["error"]
                raise ExecdRequestError(str(err.get("code")), f"job {i}: {err.get('message')}")
            results.append(_to_result(fields, rblobs[2 * i], rblobs[2 * i + 1], j.output_limit))
        return results

    async def signal(self, pid: int, signum: int, *, timeout: float = 10.0) -> bool:
        """Signal the process group of a live process this execd started (live.py); False
        when it is not one, or has ended."""
        reply, _ = await self._request({"op": "signal", "pid": int(pid), "signal": int(signum)}, deadline_s=timeout)
        return bool(reply.get("delivered"))

    async def reset(self, dirs: Sequence[str], workdir: str | None = None, *, timeout: float = 60.0) -> None:
        """Kill every process but init and execd, empty `dirs`, give `workdir` mode 0755: a
        reused sandbox made ready for its next user, with no process started for it."""
        await self._request({"op": "reset", "dirs": list(dirs), "workdir": workdir}, deadline_s=timeout)

    async def read_file(self, path: str, *, timeout: float = 60.0) -> bytes:
        _, blobs = await self._request({"op": "read_file", "path": path}, deadline_s=timeout)
        return blobs[0]

    async def write_file(
        self, path: str, data: bytes | str, mode: int = 0o644, *, timeout: float = 60.0
    ) -> None:
        await self._request(
            {"op": "write_file", "path": path, "mode": mode}, [as_bytes(data)], deadline_s=timeout
        )

    async def put_archive(self, dest_dir: str, tar_bytes: bytes, *, timeout: float = 120.0) -> None:
        """Extract a tar into `dest_dir` (created), refusing members that escape it."""
        await self._request({"op": "put_archive", "path": dest_dir}, [tar_bytes], deadline_s=timeout)

    async def get_archive(self, path: str, *, timeout: float = 120.0) -> bytes:
        """A tar of `path` with its basename at the top."""
        _, blobs = await self._request({"op": "get_archive", "path": path}, deadline_s=timeout)
        return blobs[0]

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        same_loop = anyio.lowlevel.current_token() == self._loop
        for conn in idle:
            if same_loop:
                await conn.aclose()
            else:
                conn.abandon()

    async def __aenter__(self) -> ExecdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _job_header(
    argv: Command,
    timeout: float,
    env: Mapping[str, str] | None,
    cwd: str | None,
    has_stdin: bool,
    output_limit: int,
) -> dict[str, Any]:
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")
    if output_limit < 0:
        raise ValueError(f"output_limit must be >= 0, got {output_limit}")
    h: dict[str, Any] = {"argv": shell_argv(argv), "timeout": timeout, "output_limit": output_limit}
    if env:
        h["env"] = dict(env)
    if cwd:
        h["cwd"] = cwd
    if has_stdin:
        h["stdin"] = 0
    return h


def _to_result(fields: Mapping[str, Any], out: bytes, err: bytes, limit: int) -> ExecResult:
    return ExecResult(
        exit_code=int(fields["exit_code"]),
        stdout_bytes=out,
        stderr_bytes=err,
        duration_s=float(fields.get("duration_s", 0.0)),
        timed_out=bool(fields.get("timed_out")),
        oom_killed=bool(fields.get("oom_killed")),
        truncated=bool(fields.get("stdout_truncated") or fields.get("stderr_truncated")),
        output_limit=limit,
    )
