"""Session bookkeeping for live processes (Connect `Start` with stdin, `SendInput`,
`SendSignal`, `Connect`, `List`): which processes of a sandbox run, under which session
uuid, and who is attached to their output. The processes themselves come from
`Sandbox.start_live` (sandgym/sandboxes/live.py) and outlive the server: the sandbox's row
keeps `rows()`, and the next server on the state attaches to them again
(`Sandbox.attach_live`), so a client's re-attach (the SDK's `Connect`) finds its process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from sandgym.sandboxes.live import Event, LiveProcess

log = logging.getLogger(__name__)

_RETAIN_S = 120.0  # an exited session stays attachable (replays its end) this long


@dataclass
class Session:
    """One live process and the streams attached to it."""

    uuid: str
    argv: list[str]
    cwd: str | None
    process: LiveProcess
    subscribers: set[MemoryObjectSendStream[Event]] = field(default_factory=set)
    exit_code: int | None = None
    ended_at: float | None = None
    seen: set[str] = field(default_factory=set)  # input/signal idempotency keys
    error: str | None = None

    def subscribe(self) -> tuple[MemoryObjectSendStream[Event], AsyncIterator[Event]]:
        send, recv = anyio.create_memory_object_stream[Event](1000)
        if self.ended_at is not None:
            send.send_nowait(("exit", self.exit_code if self.exit_code is not None else -1))
            send.close()
        else:
            self.subscribers.add(send)
        return send, recv

    def unsubscribe(self, send: MemoryObjectSendStream[Event]) -> None:
        self.subscribers.discard(send)
        send.close()

    async def pump(self) -> None:
        """Hand the process's output to the attached streams until it exits. Cancelled (the
        server leaves), it lets go of the process, which runs on for the next server."""
        try:
            async with aclosing(self.process.events()) as events:
                async for ev in events:
                    if ev[0] == "exit":
                        self.exit_code = int(ev[1])
                    for s in list(self.subscribers):
                        try:
                            s.send_nowait(ev)
                        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                            # A reader that stopped reading loses output, never the process.
                            pass
        except anyio.get_cancelled_exc_class():
            for s in list(self.subscribers):
                s.close()
            self.subscribers.clear()
            raise
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("live process %s failed: %s", self.uuid, self.error)
            for s in list(self.subscribers):
                try:
                    s.send_nowait(("exit", -1))
                except Exception:
                    pass
        self.ended_at = time.monotonic()
        for s in list(self.subscribers):
            s.close()
        self.subscribers.clear()
        with anyio.CancelScope(shield=True):
            await self.process.cleanup()

    def to_row(self) -> dict[str, object] | None:
        """What the next server needs to attach to this process again (None: it cannot)."""
        handle = self.process.handle()
        if handle is None or self.ended_at is not None:
            return None
        return {"uuid": self.uuid, "argv": self.argv, "cwd": self.cwd, "handle": handle.model_dump()}


class SessionTable:
    """Live processes of one sandbox, by session uuid (the SDK's idempotency key)."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    def get(self, session_uuid: str | None = None, pid: int | None = None) -> Session | None:
        self._expire()
        if session_uuid:
            return self.sessions.get(session_uuid)
        if pid:
            return next((s for s in self.sessions.values() if s.process.pid == pid), None)
        return None

    def running(self) -> list[Session]:
        self._expire()
        return [s for s in self.sessions.values() if s.ended_at is None]

    def add(self, session: Session) -> None:
        self.sessions[session.uuid] = session

    def _expire(self) -> None:
        now = time.monotonic()
        for k in [k for k, s in self.sessions.items() if s.ended_at and now - s.ended_at > _RETAIN_S]:
            del self.sessions[k]

    def detach_all(self) -> None:
        """End every attached output stream, not the processes (a server that drains: its
        clients re-attach to the next server)."""
        for s in self.sessions.values():
            for send in list(s.subscribers):
                s.unsubscribe(send)

    def rows(self) -> list[dict[str, object]]:
        """The running processes another server can attach to (`Session.to_row`)."""
        return [row for s in self.sessions.values() if (row := s.to_row()) is not None]

    async def kill_all(self, *, keep_attachable: bool = False) -> None:
        """SIGKILL the running processes; `keep_attachable`: only those no other server
        could attach to."""
        for s in self.running():
            if keep_attachable and s.to_row() is not None:
                continue
            try:
                await s.process.signal(9)
            except Exception:
                pass
