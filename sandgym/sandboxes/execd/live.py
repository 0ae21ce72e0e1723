"""`ExecdLiveProcess`: a live process run by execd (daemon.py's `Live`) on a connection of
its own: the start, stdin, output and the exit code are frames on that one connection, so a
live process costs what an exec costs (no runtime exec API, no helper commands).

The process runs in its own process group as execd's user, with the container's env and
workdir as defaults. Signals go to that group by pid over a pooled connection ("signal").
It belongs to execd, not to this side: if this side goes away (or stops following its
`events`), it runs on with its stdin open, its output dropped, until it exits or execd ends,
and execd keeps its exit status. `handle()` names it by execd's id; another client attaches
to it from that ("attach": output from then on, stdin, the exit status).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import anyio

from ..errors import SandboxGoneError
from ..live import Event, LiveHandle, LiveProcess
from .client import BROKEN, Connection, ExecdClient, ExecdRequestError

START_TIMEOUT_S = 60.0


class ExecdLiveProcess(LiveProcess):
    KIND = "execd"

    def __init__(self, client: ExecdClient, argv: Sequence[str], handle: LiveHandle | None = None) -> None:
        """A process to `start`, or (with `handle`) one started earlier to `attach` to."""
        self.client = client
        self.argv = list(argv)
        self.pid = handle.pid if handle is not None else 0
        self.id = handle.key if handle is not None else ""  # execd's; none from an execd that keeps none
        self._conn: Connection | None = None
        self._send_lock = anyio.Lock()
        self._ended = False

    def handle(self) -> LiveHandle | None:
        return LiveHandle(kind="execd", key=self.id, pid=self.pid) if self.id else None

    async def start(self, env: Mapping[str, str] | None, cwd: str | None) -> None:
        header: dict[str, Any] = {"op": "live", "argv": self.argv}
        if env:
            header["env"] = dict(env)
        if cwd:
            header["cwd"] = cwd
        await self._open(header)

    async def attach(self) -> None:
        try:
            await self._open({"op": "attach", "id": self.id})
        except ExecdRequestError as exc:  # not_found; or an execd from before "attach"
            raise RuntimeError(f"live process {self.pid} ({self.id}) cannot be attached to: {exc}") from exc

    async def _open(self, header: dict[str, Any]) -> None:
        """Send the request that makes this connection the process's, and read "started"."""
        conn = await self.client.connect()
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                await conn.send(header, ())
                reply, _ = await conn.recv()
        except BaseException as exc:
            await conn.aclose()
            if isinstance(exc, TimeoutError):
                raise SandboxGoneError(f"execd did not answer {header['op']!r} in {START_TIMEOUT_S:.0f}s") from exc
            if isinstance(exc, BROKEN):
                raise SandboxGoneError(f"execd went away during {header['op']!r} of a live process: {exc!r}") from exc
            raise
        if reply.get("event") != "started":
            await conn.aclose()
            err = reply.get("error") or {}
            raise ExecdRequestError(str(err.get("code", "internal")), str(err.get("message", reply)))
        self.pid = int(reply["pid"])
        self.id = str(reply.get("id") or "")
        self._conn = conn

    async def events(self) -> AsyncGenerator[Event, None]:
        conn = self._conn
        if conn is None:
            raise RuntimeError("process not started")
        try:
            while True:
                reply, blobs = await conn.recv()
                if reply.get("event") == "output":
                    yield (str(reply.get("stream")), blobs[0] if blobs else b"")
                    continue
                if not reply.get("ok"):  # e.g. "detached": another client attached to it
                    err = reply.get("error") or {}
                    raise ExecdRequestError(str(err.get("code", "internal")), str(err.get("message", "")))
                self._ended = True
                yield ("exit", int(reply["result"]["exit_code"]))
                return
        except BROKEN as exc:
            raise SandboxGoneError(f"execd went away during live process {self.pid}: {exc!r}") from exc
        finally:
            if not self._ended:  # stopped following: hang up, the process runs on in execd
                await self.cleanup()

    async def write_stdin(self, data: bytes) -> None:
        conn = self._conn
        if conn is None:
            raise RuntimeError("process not started, or no longer followed")
        try:
            async with self._send_lock:
                await conn.send({"op": "stdin"}, [bytes(data)])
        except BROKEN as exc:
            if self._ended:
                return  # what a pipe to an exited process takes: nothing
            raise SandboxGoneError(f"execd went away during live process {self.pid}: {exc!r}") from exc

    async def signal(self, signum: int) -> None:
        await self.client.signal(self.pid, signum)

    async def cleanup(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()
