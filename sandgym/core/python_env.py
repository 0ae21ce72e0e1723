"""PythonEnv: a `python` tool, a persistent REPL (sandbox_repl.SandboxRepl) in the rollout's
own sandbox."""

from __future__ import annotations

from typing import Any

import anyio

from .sandbox_env import SandboxEnv, format_exec
from .sandbox_repl import SandboxRepl
from .state import State


class PythonEnv(SandboxEnv):
    """A `python` tool: a persistent REPL in the rollout's sandbox (variables survive between
    calls; a crash or timeout is reported and the REPL restarted). `bash` is kept when
    `with_bash` is set.

    The REPL's server runs as one long exec held by a task group that spans the rollout's
    turns; each tool call is a short client exec talking to it over a unix socket."""

    def __init__(self, *args: Any, with_bash: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not with_bash:
            self.tools.pop("bash", None)
            self.skipped_args.pop("bash", None)
            self.tool_schemas = [s for s in self.tool_schemas if s["function"]["name"] != "bash"]
        self.add_tool(self.python, args_to_skip=["sandbox", "state"])

    def update_tool_args(self, tool_name: str, tool_args: dict[str, Any], messages: list[Any], state: State) -> dict[str, Any]:
        tool_args = super().update_tool_args(tool_name, tool_args, messages, state)
        if tool_name == "python":
            tool_args["state"] = state
        return tool_args

    async def run_turns(self, client: Any, model: str, state: State, sampling_args: Any) -> None:
        async with anyio.create_task_group() as tg:
            state.scratch["repl_tg"] = tg
            try:
                await super().run_turns(client, model, state, sampling_args)
            finally:
                tg.cancel_scope.cancel()  # ends the REPL server's exec (and the server)
                state.scratch.pop("repl_tg", None)
                state.scratch.pop("repl", None)

    async def python(self, code: str, sandbox: Any, state: State) -> str:
        """Run Python code in a persistent interpreter; variables, functions and imports stay
        defined between calls. The value of a final expression is printed.

        Args:
            code: Python source to execute.
        """
        repl = state.scratch.get("repl")
        if repl is None:
            repl = state.scratch["repl"] = SandboxRepl(sandbox, state.scratch["repl_tg"], name="repl")
        t = self.command_timeout_s
        reply = await repl.run(code, timeout=t)
        parts = ["[the Python REPL had stopped and was restarted: earlier variables are gone]"] if reply.restarted else []
        if reply.status == "failed" and reply.result is not None:
            return "\n".join([*parts, "Error: the Python tool failed:\n" + format_exec(reply.result, timeout=t)])
        if reply.stdout:
            parts.append(reply.stdout.rstrip("\n"))
        if reply.stderr:
            parts.append(reply.stderr.rstrip("\n"))
        # On anything but "ok" the REPL stopped its server: the next call starts a fresh one.
        if reply.status == "timeout":
            parts.append(f"TimeoutError: execution exceeded {t:g}s; the REPL was restarted and its variables are lost.")
        elif reply.status == "crashed":
            parts.append("Error: the Python REPL crashed; it was restarted and its variables are lost.")
        elif reply.status == "unavailable":
            parts.append("Error: the Python REPL could not be started; it will be retried on the next call.")
        return "\n".join(parts) or "(no output)"
