"""`ExecdLiveProcess`: a live process run by execd (server.py's "live" op) on a connection
of its own: the start, stdin, output and the exit code are frames on that one connection,
so a live process costs what an exec costs (no runtime exec API, no helper commands).

The process runs in its own process group as execd's user, with the container's env and
workdir as defaults. Signals go to that group by pid over a pooled connection ("signal").
If this side goes away before the process ends, it keeps running (stdin closed, output
dropped) until it exits or execd ends; `signal` still reaches it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio

from ..errors import SandboxGoneError
from ..live import Event, LiveProcess
from .client import BROKEN, Connection, ExecdClient, ExecdRequestError

START_TIMEOUT_S = 60.0


class ExecdLiveProcess(LiveProcess):
    def __init__(self, client: ExecdClient, argv: Sequence[str]) -> None:
        self.client = client
        self.argv = list(argv)
        self.pid = 0
        self._conn: Connection | None = None
        self._send_lock = anyio.Lock()
        self._ended = False

    async def start(self, env: Mapping[str, str] | None, cwd: str | None) -> None:
        conn = await self.client.connect()
        header: dict[str, Any] = {"op": "live", "argv": self.argv}
        if env:
            header["env"] = dict(env)
        if cwd:
            header["cwd"] = cwd
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                await conn.send(header, ())
                reply, _ = await conn.recv()
        except BaseException as exc:
            await conn.aclose()
            if isinstance(exc, TimeoutError):
                raise SandboxGoneError(f"execd did not start the live process in {START_TIMEOUT_S:.0f}s") from exc
            if isinstance(exc, BROKEN):
                raise SandboxGoneError(f"execd went away while starting a live process: {exc!r}") from exc
            raise
        if reply.get("event") != "started":
            await conn.aclose()
            err = reply.get("error") or {}
            raise ExecdRequestError(str(err.get("code", "internal")), str(err.get("message", reply)))
        self.pid = int(reply["pid"])
        self._conn = conn

    async def events(self) -> AsyncIterator[Event]:
        conn = self._conn
        if conn is None:
            raise RuntimeError("process not started")
        try:
            while True:
                reply, blobs = await conn.recv()
                if reply.get("event") == "output":
                    yield (str(reply.get("stream")), blobs[0] if blobs else b"")
                    continue
                self._ended = True
                if not reply.get("ok"):
                    err = reply.get("error") or {}
                    raise ExecdRequestError(str(err.get("code", "internal")), str(err.get("message", "")))
                yield ("exit", int(reply["result"]["exit_code"]))
                return
        except BROKEN as exc:
            raise SandboxGoneError(f"execd went away during live process {self.pid}: {exc!r}") from exc

    async def write_stdin(self, data: bytes) -> None:
        conn = self._conn
        if conn is None:
            raise RuntimeError("process not started")
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
