"""Live processes: a command that runs while its caller streams its output, writes its
stdin and signals it (what the platform's Connect `Start` with stdin, `SendInput`,
`SendSignal` and `Connect` need). `Sandbox.exec` runs a command to completion; a live
process is started with `Sandbox.start_live`, a capability every sandbox has:

- `ExecdLiveProcess` (execd/live.py): in a sandbox whose main process is execd (the docker
  provider's, where the image has python3), execd runs the command on a connection of its
  own that carries stdin, output and the exit code: a live process costs what an exec does.
- `ShellLiveProcess`, here, is built from `Sandbox.exec` alone and so works on every
  provider (`Sandbox.start_live`'s default, and the docker provider's for sandboxes without
  execd): the command runs detached in its own session inside the sandbox with a FIFO as
  stdin and files as stdout/stderr; a poller reads new bytes by offset (20 ms, backing off
  to 250 ms when quiet); stdin is written into the FIFO; signals go to the process group.
  Its cost is one exec per poll, and latency of one poll interval.

Either way the process does not depend on whoever drives it: it runs on when its driver
goes (a platform server that stops or crashes), and its stdin, pid and exit status stay
inside the sandbox (with execd, which outlives the driver; otherwise in a directory).
`handle()` names the process there, and `Sandbox.attach_live(handle, argv)` attaches to it
again from another driver (the next server on the same state): output from then on, stdin,
signals, and the exit status even when the process ended in between.
"""

from __future__ import annotations

import logging
import shlex
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Literal, Protocol

import anyio
from pydantic import BaseModel

from .result import ExecResult

log = logging.getLogger(__name__)

Event = tuple[str, bytes | int]  # ("stdout"|"stderr", bytes) or ("exit", code)

_CHUNK = 512 * 1024


class LiveHandle(BaseModel):
    """Names a live process inside its sandbox, for another driver to attach to it
    (`Sandbox.attach_live`): `kind` is the implementation that started it, `key` how that one
    finds it again (ShellLiveProcess: its directory; ExecdLiveProcess: execd's id for it)."""

    kind: Literal["shell", "execd"]
    key: str
    pid: int


class LiveProcess(ABC):
    """One running command of a sandbox. Made and started by `Sandbox.start_live`, or made
    from a `LiveHandle` and attached to by `Sandbox.attach_live`."""

    pid: int

    def handle(self) -> LiveHandle | None:
        """What re-attaches to this process from another driver; None when nothing can."""
        return None

    @abstractmethod
    async def start(self, env: Mapping[str, str] | None, cwd: str | None) -> None:
        """Start the command; `pid` is set when this returns."""

    @abstractmethod
    async def attach(self) -> None:
        """(Made from a handle.) Attach to the process it names, which may have ended since
        (`events` then reports its exit status); RuntimeError when it is gone."""

    @abstractmethod
    def events(self) -> AsyncGenerator[Event, None]:
        """Output as it appears (from the start, or from the attach), then one ("exit",
        code). Iterated once; closing it early lets go of the process, which runs on."""

    @abstractmethod
    async def write_stdin(self, data: bytes) -> None: ...

    @abstractmethod
    async def signal(self, signum: int) -> None: ...

    @abstractmethod
    async def cleanup(self) -> None:
        """Remove what the process left behind (not the process; signal it first)."""


class Executes(Protocol):
    """What a shell live process needs of its sandbox (`Sandbox.exec`; named here so that this
    module needs nothing of base.py, which imports it)."""

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult: ...


class ShellLiveProcess(LiveProcess):
    KIND = "shell"

    def __init__(self, sandbox: Executes, argv: Sequence[str], handle: LiveHandle | None = None) -> None:
        """A process to `start`, or (with `handle`) one started earlier to `attach` to."""
        self.sb = sandbox
        self.argv = list(argv)
        self.dir = handle.key if handle is not None else f"/tmp/.sandgym-proc-{uuid.uuid4().hex[:16]}"
        self.pid = handle.pid if handle is not None else 0
        self.offsets = (0, 0)  # where `events` starts reading stdout and stderr

    def handle(self) -> LiveHandle:
        return LiveHandle(kind="shell", key=self.dir, pid=self.pid)

    async def attach(self) -> None:
        """Check that the process's directory is still there (it may have exited since, which
        `events` reports) and note how much output it has written: `events` starts there
        (output from now on, the SDK's contract); RuntimeError when it is gone."""
        d = shlex.quote(self.dir)
        res = await self.sb.exec(["/bin/sh", "-c", f"test -p {d}/in && stat -c %s {d}/out {d}/err"], timeout=30)
        parts = res.stdout.split()
        if res.exit_code != 0 or len(parts) != 2:
            raise RuntimeError(f"live process {self.pid} ({self.dir}) is gone")
        self.offsets = (int(parts[0]), int(parts[1]))

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

    async def events(self) -> AsyncGenerator[Event, None]:
        o, e = self.offsets
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
