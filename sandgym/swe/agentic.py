"""The agentic SWE environment: a model fixes the task in its sandbox with `bash` and a
file editor (`str_replace_editor`: view / create / str_replace / insert); the reward is the
debug run's resolved check (test patch, tests, FAIL_TO_PASS and PASS_TO_PASS all pass).

Built on sandgym.core's SandboxEnv (one sandbox per rollout, released after scoring), with
the task's own image and /testbed as the workdir. The `oracle` policy applies the gold patch
through the editor (one `str_replace` per hunk, or a whole-file `create` where a hunk's
text is not unique), so the environment is validated with no model; `null` does nothing
and scores 0.

Images: built here (`image_source="build"`, the default) or SWE-bench's prebuilt instance
images (`"prebuilt"`, named and pulled as sandgym.swe.prebuilt says); only the image layout
differs (sandbox profile and user, PATH, the conda activation before the tests).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from sandgym.core.failures import ScoringTimeout
from sandgym.core.rubric import Rubric
from sandgym.core.sandbox_env import SandboxEnv, checked_exec
from sandgym.core.state import Message, State
from sandgym.core.tools import tool_call
from sandgym.sandboxes.errors import SandboxFileNotFound

from .debug import network_error, network_policy, task_spec
from .evaluate import evaluate, prepare
from .images import BUILT_LAYOUT, ImageLayout, TaskImageBuilder
from .network import network_failures
from .patches import PatchError, apply_hunks, parse_patch
from .prebuilt import PREBUILT_LAYOUT, PrebuiltImages
from .tasks import TESTBED, SWETask, load_tasks

SYSTEM_PROMPT = f"""You are a software engineer fixing an issue in a Python repository.
The repository is checked out at {TESTBED}; the shell starts there. You have two tools:
`bash` runs a shell command (no network access), and `str_replace_editor` views and edits
files. Find the cause of the issue, change the source (not the tests) so that it is fixed,
and check your change by running code. When you are done, reply without calling a tool."""

VIEW_LIMIT = 400  # lines shown by `view` without a range


class SWEAgentEnv(SandboxEnv):
    def __init__(
        self,
        tasks: Sequence[SWETask] | str | Path | Any,
        *,
        builder: TaskImageBuilder | None = None,
        max_turns: int = 30,
        command_timeout_s: float = 120.0,
        memory_mb: int = 2048,
        disk_mb: int = 1024,
        network_allow: Sequence[str] | None = None,
        image_source: Literal["build", "prebuilt"] = "build",
        prebuilt: PrebuiltImages | None = None,
        **kwargs: Any,
    ) -> None:
        task_list = list(tasks) if isinstance(tasks, (list, tuple)) else load_tasks(tasks)
        if image_source not in ("build", "prebuilt"):
            raise ValueError(f"image_source must be build or prebuilt, not {image_source!r}")
        self.builder = builder or TaskImageBuilder()
        self.image_source = image_source
        self.prebuilt = prebuilt or PrebuiltImages()
        # Rows without a recipe get theirs (swebench specs, a recipes file) once, here; for
        # prebuilt images only the test side (the image holds the env).
        task_list = [self.builder.resolve(t, prebuilt=image_source == "prebuilt") for t in task_list]
        self.tasks = {t.instance_id: t for t in task_list}
        self.memory_mb, self.disk_mb = memory_mb, disk_mb
        # Hosts a `network: true` task's sandbox may reach (its tests and the agent's commands).
        self.network_allow = tuple(network_allow or ())
        rows = [agent_row(t) for t in task_list]
        kwargs.setdefault("name", "swe_agent")
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        super().__init__(eval_dataset=rows, rubric=Rubric(), max_turns=max_turns,
                         command_timeout_s=command_timeout_s, **kwargs)
        self.rubric.add_reward_func(self.resolved)
        self.rubric.add_metric(self.fail_to_pass_rate)
        self.rubric.add_metric(self.pass_to_pass_rate)
        self.add_tool(self.str_replace_editor, args_to_skip=["sandbox"])

    def task_for(self, state: State) -> SWETask:
        iid = state.info.get("instance_id")
        if iid not in self.tasks:
            raise KeyError(f"unknown instance {iid!r}")
        return self.tasks[iid]

    # ---- sandbox ---------------------------------------------------------------------

    async def setup_state(self, state: State) -> None:
        # Not SandboxEnv's: each task has its own image (built or reused here, or prebuilt).
        task = self.task_for(state)
        egress = network_policy(task, self.network_allow)
        layout: ImageLayout
        if self.image_source == "prebuilt":
            image, layout = self.prebuilt.image(task), PREBUILT_LAYOUT
        else:
            built = await self.builder.ensure(task)
            image, layout = built.tag, BUILT_LAYOUT
            state.info["image_reused"] = built.reused
        spec = task_spec(task, image, memory_mb=self.memory_mb, disk_mb=self.disk_mb, egress=egress, layout=layout)
        sb = await self.require_sandboxes().acquire(spec)
        state.scratch["sandbox"] = sb
        state.scratch["swe_layout"] = layout
        state.scratch["swe_egress"] = egress is not None
        state.sandbox_id = sb.id
        state.info["image"] = image
        state.info["image_source"] = layout.source
        logs: dict[str, str] = {}
        state.scratch["swe_logs"] = logs
        state.scratch["swe_base"] = await prepare(sb, task, logs, layout)

    # ---- tools -----------------------------------------------------------------------

    async def str_replace_editor(
        self,
        command: Literal["view", "create", "str_replace", "insert"],
        path: str,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: list[int] | None = None,
        sandbox: Any = None,
    ) -> str:
        """View, create and edit files in the repository.

        Args:
            command: `view` a file (numbered lines) or directory; `create` a file with `file_text` (replaces an existing one); `str_replace` the one occurrence of `old_str` with `new_str`; `insert` `new_str` after line `insert_line` (0 = at the top).
            path: File or directory, absolute or relative to the repository root.
            file_text: The whole content, for `create`.
            old_str: Exact text to replace; it must occur exactly once in the file.
            new_str: The replacement text (`str_replace`) or the text to insert (`insert`).
            insert_line: The line after which `insert` puts `new_str`.
            view_range: [first, last] lines to `view` (1-based; last -1 = to the end).
        """
        p = posixpath.normpath(path if path.startswith("/") else f"{TESTBED}/{path}")
        if command == "view":
            return await self._view(sandbox, p, view_range)
        if command == "create":
            if file_text is None:
                raise ValueError("`create` needs `file_text`")
            existed = await self._exists(sandbox, p)
            mode = await self._mode(sandbox, p) if existed else 0o644
            await sandbox.write_file(p, file_text, mode=mode)
            return f"{'Overwrote' if existed else 'Created'} {p} ({len(file_text.splitlines())} lines)."
        text = await _read(sandbox, p, strict=True)
        if command == "str_replace":
            if old_str is None:
                raise ValueError("`str_replace` needs `old_str`")
            n = text.count(old_str)
            if n == 0:
                raise ValueError(f"`old_str` does not occur in {p}; it must match exactly, whitespace included")
            if n > 1:
                raise ValueError(f"`old_str` occurs {n} times in {p}; include more context so it is unique")
            new = text.replace(old_str, new_str or "", 1)
            line = text[: text.index(old_str)].count("\n") + 1
        elif command == "insert":
            if insert_line is None or new_str is None:
                raise ValueError("`insert` needs `insert_line` and `new_str`")
            lines = text.splitlines(keepends=True)
            if not 0 <= insert_line <= len(lines):
                raise ValueError(f"insert_line must be in [0, {len(lines)}]")
            if lines and not lines[-1].endswith("\n") and insert_line == len(lines):
                lines[-1] += "\n"
            lines.insert(insert_line, new_str if new_str.endswith("\n") else new_str + "\n")
            new = "".join(lines)
            line = insert_line + 1
        else:
            raise ValueError(f"unknown command {command!r}; use view, create, str_replace or insert")
        await sandbox.write_file(p, new, mode=await self._mode(sandbox, p))
        return f"Edited {p}.\n" + _numbered(new, max(1, line - 3), line + 3 + (new_str or "").count("\n"))

    async def _view(self, sandbox: Any, p: str, view_range: list[int] | None) -> str:
        r = await checked_exec(sandbox, f"test -d {shlex.quote(p)}", timeout=30)
        if r.exit_code == 0:
            r = await checked_exec(sandbox, f"find {shlex.quote(p)} -maxdepth 2 -not -path '*/.git*' -not -name '__pycache__' | sort | head -500", timeout=30)
            return r.stdout or "(empty directory)"
        text = await _read(sandbox, p)
        first, last = 1, min(len(text.splitlines()), VIEW_LIMIT)
        if view_range:
            if len(view_range) != 2:
                raise ValueError("view_range is [first, last]")
            first, last = view_range[0], (len(text.splitlines()) if view_range[1] == -1 else view_range[1])
        out = _numbered(text, first, last)
        if not view_range and len(text.splitlines()) > VIEW_LIMIT:
            out += f"\n[{len(text.splitlines()) - VIEW_LIMIT} more lines; use view_range]"
        return out

    async def _exists(self, sandbox: Any, p: str) -> bool:
        return (await checked_exec(sandbox, f"test -e {shlex.quote(p)}", timeout=30)).exit_code == 0

    async def _mode(self, sandbox: Any, p: str) -> int:
        r = await checked_exec(sandbox, f"stat -c %a {shlex.quote(p)}", timeout=30)
        return int(r.stdout.strip(), 8) if r.ok and r.stdout.strip() else 0o644

    # ---- reward ----------------------------------------------------------------------

    async def resolved(self, state: State, sandbox: Any) -> float:
        """1.0 when the test patch's FAIL_TO_PASS and PASS_TO_PASS tests all pass."""
        if sandbox is None:
            return 0.0
        task = self.task_for(state)
        logs = state.scratch.setdefault("swe_logs", {})
        ev = await evaluate(sandbox, task, logs, base=state.scratch.get("swe_base"),
                            layout=state.scratch.get("swe_layout", BUILT_LAYOUT))
        rep = ev.report
        state.scratch["swe_eval"] = ev
        state.info["swe"] = {
            "resolved": bool(rep and rep.resolved), "failing_tests": rep.failing if rep else [],
            "fail_to_pass": rep.fail_to_pass if rep else {}, "pass_to_pass": rep.pass_to_pass if rep else {},
            "error": ev.error, "diff": ev.diff,
        }
        # The check could not decide (the tests timed out, their output was cut, the test patch
        # did not apply, no outcomes parsed): not the policy's 0.
        if ev.infra == "timeout":
            raise ScoringTimeout(f"the tests of {task.instance_id} did not decide: {ev.error}")
        if ev.infra is not None or rep is None:
            raise RuntimeError(f"the tests of {task.instance_id} did not decide: {ev.error}")
        if not rep.resolved:
            # Tests that failed only for want of a network say nothing of the policy's fix.
            net = network_failures(logs.get("tests", ""), rep.failing)
            state.info["swe"]["network_tests"] = net
            if net and set(rep.failing) <= set(net):
                raise RuntimeError(f"the tests of {task.instance_id} did not decide: {network_error(net, sandbox_had_network(state))}")
        return 1.0 if rep.resolved else 0.0

    def fail_to_pass_rate(self, state: State) -> float:
        return _rate(state.info.get("swe", {}).get("fail_to_pass", {}))

    def pass_to_pass_rate(self, state: State) -> float:
        return _rate(state.info.get("swe", {}).get("pass_to_pass", {}))

    # ---- the oracle ------------------------------------------------------------------

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        """First turn: the gold patch as editor calls; then a final answer with no calls."""
        if any(m.get("role") == "tool" for m in messages):
            return {"role": "assistant", "content": "I applied the fix."}
        task = self.task_for(state)
        calls = await self.gold_calls(task, state.scratch["sandbox"])
        return {"role": "assistant", "content": "Applying the fix with the editor.", "tool_calls": calls}

    async def gold_calls(self, task: SWETask, sandbox: Any) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = []

        def add(name: str, args: dict[str, Any]) -> None:
            calls.append(tool_call(name, args, f"oracle_{len(calls)}"))

        for fp in parse_patch(task.patch):
            if fp.binary:
                raise PatchError(f"{fp.path}: binary patches cannot go through the editor")
            if fp.new_path is None:  # deleted
                add("bash", {"command": f"rm -f {shlex.quote(fp.old_path or '')}"})
                continue
            if fp.old_path is None:  # new file
                add("str_replace_editor", {"command": "create", "path": fp.new_path, "file_text": apply_hunks("", fp)})
                continue
            if fp.old_path != fp.new_path:
                add("bash", {"command": f"mkdir -p \"$(dirname {shlex.quote(fp.new_path)})\" && mv {shlex.quote(fp.old_path)} {shlex.quote(fp.new_path)}"})
            if not fp.hunks:
                continue
            text = (await sandbox.read_file(f"{TESTBED}/{fp.old_path}")).decode("utf-8")
            final = apply_hunks(text, fp)
            edits: list[dict[str, str]] = []
            cur, unique = text, True  # unique: each hunk's old text occurs once when applied
            for h in fp.hunks:
                old, new = "".join(h.old), "".join(h.new)
                if not old or cur.count(old) != 1:
                    unique = False
                    break
                cur = cur.replace(old, new, 1)
                edits.append({"command": "str_replace", "path": fp.new_path, "old_str": old, "new_str": new})
            if unique and cur == final:
                for e in edits:
                    add("str_replace_editor", e)
            else:
                add("str_replace_editor", {"command": "create", "path": fp.new_path, "file_text": final})
        return calls


async def _read(sandbox: Any, p: str, *, strict: bool = False) -> str:
    # A missing file is the model's mistake (a tool error it sees), not a sandbox failure.
    try:
        data = await sandbox.read_file(p)
    except SandboxFileNotFound:
        raise ValueError(f"{p} does not exist") from None
    try:
        return data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError:
        raise ValueError(f"{p} is not UTF-8 text; edit it with bash") from None


def sandbox_had_network(state: State) -> bool:
    return bool(state.scratch.get("swe_egress"))


def _rate(d: dict[str, str]) -> float:
    return sum(v in ("passed", "xfail") for v in d.values()) / len(d) if d else 0.0


def _numbered(text: str, first: int, last: int) -> str:
    lines = text.splitlines()
    first = max(1, first)
    last = min(len(lines), last)
    return "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(first, last + 1))


def agent_row(task: SWETask) -> dict[str, Any]:
    text = (f"Repository: {task.repo} (checked out at {TESTBED}).\n\n<issue>\n{task.problem_statement.strip()}\n</issue>\n\n"
            "Fix the issue by editing the source code. Hidden tests will check your fix.")
    return {"prompt": [{"role": "user", "content": text}], "answer": task.patch,
            "info": json.dumps({"instance_id": task.instance_id, "repo": task.repo}), "task": task.instance_id}
