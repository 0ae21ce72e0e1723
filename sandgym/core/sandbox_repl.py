"""SandboxRepl: one persistent Python process in a sandbox, driven cell by cell.

The server is repl_script's (a long `exec` serving a unix socket, short client execs sending
cells). PythonEnv's `python` tool runs one per rollout; environments keep state in one across
calls (BFCL's stateful backends), or pay a slow import once and then answer many requests
(a scorer). The server's exec lives in a task group the caller owns (one that spans the
rollout or the session); `stop()` or cancelling that group ends it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup

from sandgym.sandboxes.result import ExecResult

from .repl_script import client_argv, repl_argv
from .sandbox_env import checked_exec


@dataclass
class ReplReply:
    status: str  # ok | timeout | crashed | unavailable | failed
    stdout: str = ""
    stderr: str = ""
    # The client's exec, for saying why a "failed" reply has no reply line.
    result: ExecResult | None = None
    # The server had exited on its own since the last cell: this one ran in a fresh one.
    restarted: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class SandboxRepl:
    def __init__(self, sandbox: Any, task_group: TaskGroup, *, name: str = "repl") -> None:
        self.sandbox = sandbox
        self.task_group = task_group
        self.name = name
        self.generation = 0  # counts server processes started: a new one has a fresh namespace
        self._scope: anyio.CancelScope | None = None
        self._done: anyio.Event | None = None

    @property
    def running(self) -> bool:
        return self._done is not None and not self._done.is_set()

    def start(self) -> None:
        """Start the server (a fresh process, so a fresh namespace)."""
        self.generation += 1
        scope, done = anyio.CancelScope(), anyio.Event()
        self._scope, self._done = scope, done
        argv = repl_argv("serve", f"{self.name}{self.generation}")
        sandbox = self.sandbox

        async def serve() -> None:
            try:
                with scope:
                    await sandbox.exec(argv, timeout=7 * 24 * 3600.0)
            except Exception:  # the sandbox died: the next client call says so
                pass
            finally:
                done.set()

        self.task_group.start_soon(serve)

    async def stop(self) -> None:
        if self._scope is not None and self._done is not None:
            self._scope.cancel()
            with anyio.move_on_after(30):
                await self._done.wait()
        self._scope = self._done = None

    async def run(self, code: str, *, timeout: float) -> ReplReply:
        """Run one cell; starts the server when none runs. On anything but "ok" the server is
        stopped (its state is gone) and the next call starts a fresh one."""
        restarted = self._done is not None and self._done.is_set()  # not stopped by us
        if not self.running:
            await self.stop()
            self.start()
        argv = client_argv(timeout, f"{self.name}{self.generation}")
        result = await checked_exec(self.sandbox, argv, timeout=timeout + 30, stdin=code)
        try:
            reply = json.loads(result.stdout.strip().splitlines()[-1])
            out = ReplReply(str(reply.get("status")), reply.get("stdout") or "", reply.get("stderr") or "", result, restarted)
        except (json.JSONDecodeError, IndexError, AttributeError):
            out = ReplReply("failed", result.stdout[-2000:], result.stderr[-2000:], result, restarted)
        if not out.ok:
            await self.stop()
        return out


class ReplService:
    """A persistent Python process in one sandbox of a session, set up once and then answering
    cells in turn: for work that pays a slow import once (a scorer, a verifier). `open()`
    takes the sandbox (do it before rollouts take every slot) and starts the set-up in the
    background; `run()` waits for it. A process that dies or hangs is replaced, once per
    call, and set up again."""

    def __init__(
        self,
        manager: Any,
        spec: Any,
        task_group: TaskGroup,
        *,
        setup_code: str,
        setup_timeout: float,
        check_setup: Callable[[ReplReply], None],
        name: str = "service",
    ) -> None:
        self.manager = manager
        self.spec = spec
        self.task_group = task_group
        self.setup_code = setup_code
        self.setup_timeout = setup_timeout
        self.check_setup = check_setup  # raises when the set-up cell's reply is not right
        self.name = name
        self.sandbox: Any = None
        self.repl: SandboxRepl | None = None
        self._setup_generation = -1
        self._lock = anyio.Lock()

    async def open(self) -> None:
        self.sandbox = await self.manager.acquire(self.spec)
        self.repl = SandboxRepl(self.sandbox, self.task_group, name=self.name)

        async def warm() -> None:
            try:
                await self._ready()
            except Exception:
                pass  # the first call tries again and reports

        self.task_group.start_soon(warm)

    async def _ready(self) -> SandboxRepl:
        async with self._lock:
            if self.repl is None:
                raise RuntimeError(f"{self.name}: open() the service first")
            if self.repl.running and self._setup_generation == self.repl.generation:
                return self.repl
            reply = await self.repl.run(self.setup_code, timeout=self.setup_timeout)
            self.check_setup(reply)
            self._setup_generation = self.repl.generation
            return self.repl

    async def run(self, code: str, *, timeout: float) -> ReplReply:
        reply = ReplReply("failed")
        for _ in range(2):
            repl = await self._ready()
            reply = await repl.run(code, timeout=timeout)
            if reply.ok:
                return reply
            # The process died or hung (the REPL stopped it): the next round starts a new one.
        return reply

    async def close(self) -> None:
        if self.repl is not None:
            await self.repl.stop()
        if self.sandbox is not None:
            await self.manager.release(self.sandbox)
            self.sandbox = None


class Openable(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...


S = TypeVar("S", bound=Openable)


@asynccontextmanager
async def session_service(make: Callable[[TaskGroup], S]) -> AsyncIterator[S]:
    """A service (a ReplService, or one built on it) open for the block: made by `make` with
    a task group of its own for its processes, opened, and at the end closed (shielded: a
    cancelled session still gives its sandbox back) before that group is cancelled."""
    async with anyio.create_task_group() as tg:
        service = make(tg)
        await service.open()
        try:
            yield service
        finally:
            with anyio.CancelScope(shield=True):
                await service.close()
            tg.cancel_scope.cancel()
