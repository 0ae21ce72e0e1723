"""`DockerLiveProcess`: a live process on the docker provider (`DockerSandbox.start_live`).

The process itself is `ShellLiveProcess`'s (sandboxes/live.py): detached inside the sandbox,
stdin a FIFO, output in files, so it outlives its driver and another one can attach to it
(a platform server restarted on the same state). What differs is how output arrives: in a
sandbox with python3 (every one with execd) one `docker exec` runs a small follower that
writes the files' new bytes to its own stdout/stderr as they grow and exits with the
process's exit status; its hijacked socket carries them here (demux.py), read by a daemon
thread, so output arrives within a few milliseconds without an exec per poll and without
holding one of the provider's exec threads. Without python3 the polling of the base class is
used.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from anyio import to_thread

from ...live import Event, LiveHandle, ShellLiveProcess
from .demux import AttachStream, Demux

if TYPE_CHECKING:
    from ...base import Sandbox

log = logging.getLogger(__name__)

_QUIET_WAIT_S = 1.0  # the reader wakes this often when quiet, to notice a closed socket

# argv: DIR OUT_OFFSET ERR_OFFSET (-1: from the end). The exit status is read before the
# data, so once it is seen, all output is out; waits 2 ms after output, up to 50 ms when quiet.
_FOLLOW = r"""
import os, sys, time
d = sys.argv[1]
files = []
for name, off, fd in (("out", int(sys.argv[2]), 1), ("err", int(sys.argv[3]), 2)):
    f = open(os.path.join(d, name), "rb")
    f.seek(0, 2) if off < 0 else f.seek(off)
    files.append((f, fd))
delay = 0.002
while True:
    try:
        with open(os.path.join(d, "exit")) as x:
            code = int(x.read().strip())
    except (OSError, ValueError):
        code = None
    moved = False
    for f, fd in files:
        while True:
            b = f.read(1 << 16)
            if not b:
                break
            moved = True
            while b:
                b = b[os.write(fd, b):]
    if code is not None:
        sys.exit(code)
    delay = 0.002 if moved else min(delay * 1.5, 0.05)
    time.sleep(delay)
"""


class DockerLiveProcess(ShellLiveProcess):
    def __init__(
        self,
        sandbox: Sandbox,
        api: Any,
        container_id: str,
        argv: Sequence[str],
        *,
        stream: bool,
        handle: LiveHandle | None = None,
    ) -> None:
        """`stream`: the sandbox has python3 for the follower (else output is polled)."""
        super().__init__(sandbox, argv, handle)
        self.api = api
        self.cid = container_id
        self.stream = stream
        self._stream: AttachStream | None = None

    async def events(self) -> AsyncGenerator[Event, None]:
        if not self.stream:
            async for ev in super().events():
                yield ev
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        offset = "-1" if self.from_end else "0"
        argv = ["python3", "-I", "-S", "-c", _FOLLOW, self.dir, offset, offset]

        def launch() -> tuple[str, bytes]:
            exec_id = self.api.exec_create(self.cid, argv, stdout=True, stderr=True)["Id"]
            self._stream = AttachStream(self.api.exec_start(exec_id, socket=True))
            return exec_id, self._stream.take_buffered()

        exec_id, first = await to_thread.run_sync(launch)
        reader = threading.Thread(target=self._read, args=(loop, queue, first), name="sandgym-live", daemon=True)
        reader.start()
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            self.close_stream()  # a driver that stops following (cancelled) leaves no reader
        code = -1
        for _ in range(50):  # the stream can end a moment before the engine records the exit
            info = await to_thread.run_sync(self.api.exec_inspect, exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = int(info["ExitCode"])
                break
            await anyio.sleep(0.05)
        yield ("exit", code)

    def _read(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Event | None], first: bytes) -> None:
        stream = self._stream
        assert stream is not None
        demux = Demux()
        chunk: bytes | None = first  # what http.client had read ahead (maybe nothing)
        try:
            while True:
                for ev in demux.feed(chunk or b""):
                    loop.call_soon_threadsafe(queue.put_nowait, ev)
                try:
                    chunk = stream.recv(_QUIET_WAIT_S)  # None: quiet for a while
                except OSError:  # closed by close_stream()
                    break
                if chunk == b"":
                    break  # end of stream
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    def close_stream(self) -> None:
        """Stop following (the process runs on; another driver may attach to it)."""
        if self._stream is not None:
            self._stream.close()

    async def cleanup(self) -> None:
        self.close_stream()
        await super().cleanup()
