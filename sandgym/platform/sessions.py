"""Live processes (Connect `Start` with stdin, `SendInput`, `SendSignal`, `Connect`, `List`).

`Sandbox.exec` runs a command to completion, which is all plain command execution needs. A
live process needs output while it runs, stdin and signals, so it sits behind `LiveProcess`.
`DockerLiveProcess` (live_docker.py) streams through the Docker exec API on the docker
provider. `ShellLiveProcess`, here, is built from `Sandbox.exec` alone and so works on every
provider (the fallback): the command runs detached in its own session inside the sandbox with
a FIFO as stdin and files as stdout/stderr; a poller reads new bytes by offset (20 ms, backing
off to 250 ms when quiet); stdin is written into the FIFO; signals go to the process group.
Its cost is one exec per poll, and latency of one poll interval.
"""

from __future__ import annotations

import logging
import shlex
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import ObjectSendStream

from sandgym.sandboxes.base import Sandbox

log = logging.getLogger(__name__)

Event = tuple[str, bytes | int]  # ("stdout"|"stderr", bytes) or ("exit", code)

_CHUNK = 512 * 1024
_RETAIN_S = 120.0  # an exited session stays attachable (replays its end) this long


class LiveProcess(ABC):
    pid: int

    @abstractmethod
    async def start(self, env: Mapping[str, str] | None, cwd: str | None) -> None:
        """Start the command; `pid` is set when this returns."""

    @abstractmethod
    def events(self) -> AsyncIterator[Event]:
        """Output as it appears, then one ("exit", code). Iterated once."""

    @abstractmethod
    async def write_stdin(self, data: bytes) -> None: ...

    @abstractmethod
    async def signal(self, signum: int) -> None: ...

    @abstractmethod
    async def cleanup(self) -> None:
        """Remove what the process left behind (not the process; signal it first)."""


class ShellLiveProcess(LiveProcess):
    def __init__(self, sandbox: Sandbox, argv: Sequence[str]) -> None:
        self.sb = sandbox
        self.argv = list(argv)
        self.dir = f"/tmp/.sandgym-proc-{uuid.uuid4().hex[:16]}"
        self.pid = 0

    async def start(self, env: Mapping[str, str] | None, cwd: str | None) -> None:
        d = shlex.quote(self.dir)
        # The wrapper gets its own session so an exec that cleans up its process group
        # cannot take it down; the command gets another, so signals reach all its children
        # but not the wrapper, which records the exit status (128+N for signal N).
        script = (
            f'D={d}; mkdir -p "$D" && mkfifo "$D/in" && : >"$D/out" && : >"$D/err" || exit 97\n'
            'setsid /bin/bash -c \'D=$1; shift; setsid "$@" <>"$D/in" >"$D/out" 2>"$D/err" & '
            'echo $! >"$D/pid.tmp"; mv "$D/pid.tmp" "$D/pid"; wait $!; echo $? >"$D/exit.tmp"; '
            'mv "$D/exit.tmp" "$D/exit"\' _ "$D" "$@" </dev/null >/dev/null 2>&1 &\n'
            'for i in $(seq 500); do [ -s "$D/pid" ] && break; sleep 0.01; done\n'
            'cat "$D/pid"\n'
        )
        res = await self.sb.exec(["/bin/bash", "-c", script, "launch", *self.argv], env=env, cwd=cwd, timeout=30)
        out = res.stdout.strip()
        if res.exit_code != 0 or not out.isdigit():
            raise RuntimeError(f"could not start process (exit {res.exit_code}): {res.stderr.strip() or out}")
        self.pid = int(out)

    async def _poll(self, o: int, e: int) -> tuple[bytes, bytes, int | None]:
        d = shlex.quote(self.dir)
        script = (
            f"D={d}; O={o}; E={e}; M={_CHUNK}\n"
            'x=$(cat "$D/exit" 2>/dev/null); so=$(stat -c %s "$D/out"); se=$(stat -c %s "$D/err")\n'
            "a=$((so-O)); [ $a -gt $M ] && a=$M; b=$((se-E)); [ $b -gt $M ] && b=$M\n"
            # An exit seen before the sizes means all output is in; only then report it.
            '[ $a -lt $((so-O)) ] || [ $b -lt $((se-E)) ] && x=""\n'
            'printf "%d %d %s\\n" $a $b "${x:--}"\n'
            'tail -c +$((O+1)) "$D/out" | head -c $a; tail -c +$((E+1)) "$D/err" | head -c $b\n'
        )
        res = await self.sb.exec(["/bin/bash", "-c", script], timeout=30)
        head, _, rest = res.stdout_bytes.partition(b"\n")
        parts = head.split()
        if res.exit_code != 0 or len(parts) != 3:
            raise RuntimeError(f"process poll failed (exit {res.exit_code}): {res.stderr.strip()}")
        a, b = int(parts[0]), int(parts[1])
        code = None if parts[2] == b"-" else int(parts[2])
        return rest[:a], rest[a : a + b], code

    async def events(self) -> AsyncIterator[Event]:
        o = e = 0
        delay = 0.02
        while True:
            out, err, code = await self._poll(o, e)
            if out:
                o += len(out)
                yield ("stdout", out)
            if err:
                e += len(err)
                yield ("stderr", err)
            if code is not None:
                yield ("exit", code)
                return
            delay = 0.02 if (out or err) else min(delay * 1.5, 0.25)
            await anyio.sleep(delay)

    async def write_stdin(self, data: bytes) -> None:
        # Opening the FIFO read-write never blocks, even after the process is gone.
        res = await self.sb.exec(["/bin/bash", "-c", f"cat 1<>{shlex.quote(self.dir)}/in"], stdin=data, timeout=30)
        if res.exit_code != 0:
            raise RuntimeError(f"stdin write failed: {res.stderr.strip()}")

    async def signal(self, signum: int) -> None:
        await self.sb.exec(["/bin/bash", "-c", f"kill -{int(signum)} -- -{self.pid} 2>/dev/null || kill -{int(signum)} {self.pid}"], timeout=30)

    async def cleanup(self) -> None:
        try:
            await self.sb.exec(["rm", "-rf", self.dir], timeout=30)
        except Exception as exc:  # the sandbox may be gone already
            log.debug("cleanup of %s failed: %r", self.dir, exc)


@dataclass
class Session:
    """One live process and the streams attached to it."""

    uuid: str
    argv: list[str]
    cwd: str | None
    process: LiveProcess
    subscribers: set[ObjectSendStream[Event]] = field(default_factory=set)
    exit_code: int | None = None
    ended_at: float | None = None
    seen: set[str] = field(default_factory=set)  # input/signal idempotency keys
    error: str | None = None

    def subscribe(self) -> tuple[ObjectSendStream[Event], AsyncIterator[Event]]:
        send, recv = anyio.create_memory_object_stream[Event](1000)
        if self.ended_at is not None:
            send.send_nowait(("exit", self.exit_code if self.exit_code is not None else -1))
            send.close()
        else:
            self.subscribers.add(send)
        return send, recv

    def unsubscribe(self, send: ObjectSendStream[Event]) -> None:
        self.subscribers.discard(send)
        send.close()

    async def pump(self) -> None:
        try:
            async for ev in self.process.events():
                if ev[0] == "exit":
                    self.exit_code = int(ev[1])
                for s in list(self.subscribers):
                    try:
                        s.send_nowait(ev)
                    except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                        # A reader that stopped reading loses output, never the process.
                        pass
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("live process %s failed: %s", self.uuid, self.error)
            for s in list(self.subscribers):
                try:
                    s.send_nowait(("exit", -1))
                except Exception:
                    pass
        finally:
            self.ended_at = time.monotonic()
            for s in list(self.subscribers):
                s.close()
            self.subscribers.clear()
            with anyio.CancelScope(shield=True):
                await self.process.cleanup()


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

    async def kill_all(self) -> None:
        for s in self.running():
            try:
                await s.process.signal(9)
            except Exception:
                pass
