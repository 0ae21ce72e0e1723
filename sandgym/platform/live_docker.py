"""`DockerLiveProcess`: a live process on the docker provider through the Docker exec API.

One `docker exec` with stdin attached; its hijacked socket carries stdin one way and the
multiplexed stdout/stderr frames (8-byte header: stream id, 3 zero bytes, big-endian length)
the other. A daemon thread reads the socket and hands frames to the event loop, so output
arrives as it is written, without polling, and without holding one of the provider's exec
threads. The command is started as `bash -c 'echo $$ >PIDFILE; exec "$@"'`, so the recorded
pid is the command's own; signals are sent with `kill` from a second exec. The exit code is
the exec's, from `exec_inspect` once the stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import struct
import threading
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio
from anyio import to_thread

from .sessions import Event, LiveProcess

log = logging.getLogger(__name__)

_CHUNK = 1 << 16


def docker_target(sandbox: Any) -> tuple[Any, str] | None:
    """(docker APIClient, container id) when `sandbox` (or the one a manager wraps) is a
    docker-provider sandbox, else None."""
    inner = getattr(sandbox, "inner", sandbox)
    if getattr(inner, "provider", None) != "docker":
        return None
    transport = getattr(inner, "transport", None)
    api = getattr(transport, "api", None)
    cid = getattr(transport, "container_id", None) or getattr(inner, "id", None)
    if api is None:
        try:
            import docker

            api = docker.from_env().api
        except Exception:
            return None
    return (api, cid) if cid else None


class DockerLiveProcess(LiveProcess):
    def __init__(self, api: Any, container_id: str, argv: Sequence[str]) -> None:
        self.api = api
        self.cid = container_id
        self.argv = list(argv)
        self.pid = 0
        self._pidfile = f"/tmp/.sandgym-live-{uuid.uuid4().hex[:16]}.pid"
        self._exec_id = ""
        self._sock: socket.socket | None = None
        self._raw: Any = None
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._reader: threading.Thread | None = None

    async def start(self, env: Mapping[str, str] | None, cwd: str | None) -> None:
        loop = asyncio.get_running_loop()
        wrapper = ["/bin/bash", "-c", 'echo $$ >"$0"; exec "$@"', self._pidfile, *self.argv]

        def launch() -> None:
            self._exec_id = self.api.exec_create(
                self.cid, wrapper, stdin=True, stdout=True, stderr=True,
                environment=[f"{k}={v}" for k, v in (env or {}).items()], workdir=cwd,
            )["Id"]
            self._raw = self.api.exec_start(self._exec_id, socket=True)
            self._sock = getattr(self._raw, "_sock", self._raw)
            self._sock.settimeout(None)

        await to_thread.run_sync(launch)
        self._reader = threading.Thread(target=self._read, args=(loop,), name="sandgym-live", daemon=True)
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
            return self.api.exec_start(eid).decode(errors="replace")  # type: ignore[no-any-return]

        return await to_thread.run_sync(run)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._sock is not None
        buf = bytearray()
        # http.client may already hold the first frames in its buffered reader.
        resp = getattr(self._raw, "_response", None)
        fp = getattr(getattr(getattr(resp, "raw", None), "_fp", None), "fp", None)
        if fp is not None:
            self._sock.setblocking(False)
            try:
                buf += fp.read1(_CHUNK) or b""
            except (BlockingIOError, OSError, ValueError):
                pass
            finally:
                self._sock.setblocking(True)
        try:
            while True:
                while len(buf) >= 8:
                    kind, size = struct.unpack(">BxxxL", bytes(buf[:8]))
                    if len(buf) < 8 + size:
                        break
                    data = bytes(buf[8 : 8 + size])
                    del buf[: 8 + size]
                    ev: Event = ("stdout" if kind == 1 else "stderr", data)
                    loop.call_soon_threadsafe(self._queue.put_nowait, ev)
                ready, _, _ = select.select([self._sock], [], [], 1.0)
                if not ready:
                    continue
                try:
                    chunk = self._sock.recv(_CHUNK)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                buf += chunk
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
        sock = self._sock
        if sock is None:
            raise RuntimeError("process not started")
        await to_thread.run_sync(sock.sendall, data)

    async def signal(self, signum: int) -> None:
        await self._helper(f"kill -{int(signum)} {self.pid} 2>/dev/null; true")

    async def cleanup(self) -> None:
        for closer in (getattr(self._sock, "close", None), getattr(self._raw, "close", None)):
            if closer is not None:
                try:
                    closer()
                except Exception:
                    pass
        try:
            await self._helper(f"rm -f {self._pidfile}")
        except Exception as exc:  # container gone
            log.debug("live process cleanup: %r", exc)
