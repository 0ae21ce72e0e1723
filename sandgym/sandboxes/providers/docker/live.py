"""`DockerLiveProcess`: a live process on the docker provider through the Docker exec API
(`DockerSandbox.start_live` for sandboxes without execd, i.e. images without python3;
sandboxes with execd get `ExecdLiveProcess`, which needs no engine exec at all).

One `docker exec` with stdin attached; its hijacked socket carries stdin one way and the
multiplexed stdout/stderr frames (demux.py) the other. A daemon thread reads the socket and
hands output to the event loop, so output arrives as it is written, without polling, and
without holding one of the provider's exec threads. The command is started as
`bash -c 'echo $$ >PIDFILE; exec "$@"'`, so the recorded pid is the command's own; signals
are sent with `kill` from a second exec. The exit code is the exec's, from `exec_inspect`
once the stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio
from anyio import to_thread

from ...live import Event, LiveProcess
from .demux import AttachStream, Demux

log = logging.getLogger(__name__)

_QUIET_WAIT_S = 1.0  # the reader wakes this often when quiet, to notice a closed socket


class DockerLiveProcess(LiveProcess):
    def __init__(self, api: Any, container_id: str, argv: Sequence[str]) -> None:
        self.api = api
        self.cid = container_id
        self.argv = list(argv)
        self.pid = 0
        self._pidfile = f"/tmp/.sandgym-live-{uuid.uuid4().hex[:16]}.pid"
        self._exec_id = ""
        self._stream: AttachStream | None = None
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._reader: threading.Thread | None = None

    async def start(self, env: Mapping[str, str] | None, cwd: str | None) -> None:
        loop = asyncio.get_running_loop()
        wrapper = ["/bin/bash", "-c", 'echo $$ >"$0"; exec "$@"', self._pidfile, *self.argv]

        def launch() -> bytes:
            self._exec_id = self.api.exec_create(
                self.cid, wrapper, stdin=True, stdout=True, stderr=True,
                environment=[f"{k}={v}" for k, v in (env or {}).items()], workdir=cwd,
            )["Id"]
            self._stream = AttachStream(self.api.exec_start(self._exec_id, socket=True))
            # Before any stdin can be written (see take_buffered).
            return self._stream.take_buffered()

        first = await to_thread.run_sync(launch)
        self._reader = threading.Thread(
            target=self._read, args=(loop, first), name="sandgym-live", daemon=True
        )
        self._reader.start()
        for _ in range(500):
            r = await self._helper(f"cat {self._pidfile} 2>/dev/null")
            if r.strip().isdigit():
                self.pid = int(r.strip())
                return
            await anyio.sleep(0.01)
        raise RuntimeError("live process did not report its pid")

    async def _helper(self, script: str) -> str:
        def run() -> str:
            eid = self.api.exec_create(self.cid, ["/bin/sh", "-c", script], stdout=True, stderr=True)["Id"]
            return self.api.exec_start(eid).decode(errors="replace")

        return await to_thread.run_sync(run)

    def _read(self, loop: asyncio.AbstractEventLoop, first: bytes) -> None:
        stream = self._stream
        assert stream is not None
        demux = Demux()
        chunk: bytes | None = first  # what http.client had read ahead (maybe nothing)
        try:
            while True:
                for ev in demux.feed(chunk or b""):
                    loop.call_soon_threadsafe(self._queue.put_nowait, ev)
                try:
                    chunk = stream.recv(_QUIET_WAIT_S)  # None: quiet for a while
                except OSError:  # closed by cleanup()
                    break
                if chunk == b"":
                    break  # end of stream
        finally:
            loop.call_soon_threadsafe(self._queue.put_nowait, None)

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = await self._queue.get()
            if ev is None:
                break
            yield ev
        code = -1
        for _ in range(50):  # the stream can end a moment before the engine records the exit
            info = await to_thread.run_sync(self.api.exec_inspect, self._exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = int(info["ExitCode"])
                break
            await anyio.sleep(0.05)
        yield ("exit", code)

    async def write_stdin(self, data: bytes) -> None:
        stream = self._stream
        if stream is None:
            raise RuntimeError("process not started")
        await to_thread.run_sync(stream.sendall, data)

    async def signal(self, signum: int) -> None:
        await self._helper(f"kill -{int(signum)} {self.pid} 2>/dev/null; true")

    async def cleanup(self) -> None:
        if self._stream is not None:
            self._stream.close()
        try:
            await self._helper(f"rm -f {self._pidfile}")
        except Exception as exc:  # container gone
            log.debug("live process cleanup: %r", exc)
