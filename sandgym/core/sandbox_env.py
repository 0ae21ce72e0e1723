"""SandboxEnv: a `bash` tool in the rollout's own sandbox (PythonEnv, a persistent Python REPL
in it, is in python_env.py).

One sandbox per rollout, from the bound SandboxManager, acquired at the first tool call (or
in `setup_state` with lazy_sandbox=False) and always released by a `@cleanup` method after
scoring (so reward functions can still use it)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable
from typing import Any

from sandgym.sandboxes.errors import SandboxError, SandboxGoneError
from sandgym.sandboxes.result import ExecResult
from sandgym.sandboxes.spec import SandboxSpec

from .decorators import cleanup
from .state import State
from .tools import StatefulToolEnv

log = logging.getLogger(__name__)


async def checked_exec(sandbox: Any, cmd: str | list[str], *, timeout: float, stdin: str | bytes | None = None) -> ExecResult:
    """exec that turns a vanished sandbox into SandboxGoneError (the rollout's error, not a
    tool result the model would see)."""
    return await checked(sandbox, sandbox.exec(cmd, timeout=timeout, stdin=stdin))


async def checked(sandbox: Any, call: Awaitable[ExecResult]) -> ExecResult:
    """The result of `call` (an exec or exec_python of `sandbox`), a vanished sandbox
    turned into SandboxGoneError."""
    try:
        result = await call
    except SandboxError:
        raise
    except Exception as exc:
        raise SandboxGoneError(f"exec in sandbox {sandbox.id} failed: {type(exc).__name__}: {exc}") from exc
    if result.exit_code != 0 and not result.timed_out and not await sandbox.alive():
        raise SandboxGoneError(f"sandbox {sandbox.id} is gone (exit {result.exit_code}: {result.stderr[-300:]})")
    return result


def format_exec(result: ExecResult, *, timeout: float) -> str:
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if result.timed_out:
        parts.append(f"[command timed out after {timeout:g}s]")
    elif result.oom_killed:
        parts.append("[killed: out of memory]")
    elif result.exit_code != 0:
        parts.append(f"[exit code {result.exit_code}]")
    if result.truncated:
        parts.append("[output truncated]")
    return "\n".join(parts) or "(no output)"


_FLAG_LINES = (
    (re.compile(r"^\[command timed out after ([0-9.e+-]+)s\]$"), "timed_out"),
    (re.compile(r"^\[killed: out of memory\]$"), "oom_killed"),
    (re.compile(r"^\[exit code (-?\d+)\]$"), "exit_code"),
    (re.compile(r"^\[output truncated\]$"), "truncated"),
)


def exec_flags(text: str) -> dict[str, Any]:
    """What `format_exec` said about a command, read back from its text (the closing
    bracketed lines, and whether there was stderr): for showing a tool result's flags.
    A tool result not made by `format_exec` gives {}, or what its last lines happen to say."""
    flags: dict[str, Any] = {}
    lines = text.rstrip("\n").split("\n")
    for line in reversed(lines[-3:]):
        for pattern, name in _FLAG_LINES:
            m = pattern.match(line)
            if m and name not in flags:
                flags[name] = int(m.group(1)) if name == "exit_code" else (float(m.group(1)) if m.groups() else True)
    if flags.get("timed_out") is not None:
        flags["timeout_s"], flags["timed_out"] = flags["timed_out"], True
    if "\nstderr:\n" in "\n" + text:
        flags["stderr"] = True
    return flags


class SandboxEnv(StatefulToolEnv):
    """A `bash` tool running in this rollout's own sandbox."""

    def __init__(
        self,
        *args: Any,
        sandbox_spec: SandboxSpec | None = None,
        command_timeout_s: float = 30.0,
        lazy_sandbox: bool = True,
        reuse_sandboxes: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, sandbox_spec=sandbox_spec or SandboxSpec(), **kwargs)
        self.command_timeout_s = command_timeout_s
        # Reuse: a rollout's sandbox goes back to the warm pool after a reset (no processes
        # left, empty workdir and /tmp) where the provider can reset; only for environments
        # whose setup_sandbox leaves nothing a reset would not restore.
        self.reuse_sandboxes = reuse_sandboxes
        # Lazy: the sandbox is made at the first tool call, so a rollout that never uses a
        # tool costs no sandbox.
        self.lazy_sandbox = lazy_sandbox
        self.add_tool(self.bash, args_to_skip=["sandbox"])

    async def setup_state(self, state: State) -> None:
        await super().setup_state(state)
        if not self.lazy_sandbox:
            await self.sandbox_for(state)

    async def sandbox_for(self, state: State) -> Any:
        """This rollout's sandbox, acquired (and prepared) on first use; counted as setup."""
        sb = state.scratch.get("sandbox")
        if sb is None:
            assert self.sandbox_spec is not None
            t0 = time.perf_counter()
            sb = await self.require_sandboxes().acquire(self.sandbox_spec)
            state.scratch["sandbox"] = sb
            state.sandbox_id = sb.id
            await self.setup_sandbox(sb, state)
            dt = time.perf_counter() - t0
            state.timing.setup_s += dt
            state.scratch["sandbox_setup_s"] = state.scratch.get("sandbox_setup_s", 0.0) + dt
        return sb

    async def prepare_tool_args(self, tool_name: str, tool_args: dict[str, Any], messages: list[Any], state: State) -> dict[str, Any]:
        if "sandbox" in self.skipped_args.get(tool_name, []):
            await self.sandbox_for(state)
        return await super().prepare_tool_args(tool_name, tool_args, messages, state)

    async def setup_sandbox(self, sandbox: Any, state: State) -> None:
        """Per-rollout preparation inside the fresh sandbox (files, setup commands)."""

    @cleanup
    async def release_sandbox(self, state: State) -> None:
        sb = state.scratch.pop("sandbox", None)
        if sb is not None and self.sandboxes is not None:
            await self.sandboxes.release(sb, reuse=self.reuse_sandboxes and not state.error)

    async def bash(self, command: str, sandbox: Any) -> str:
        """Run a bash command in the sandbox and return its output.

        Args:
            command: The command line to run (bash syntax).
        """
        result = await checked_exec(sandbox, command, timeout=self.command_timeout_s)
        return format_exec(result, timeout=self.command_timeout_s)
