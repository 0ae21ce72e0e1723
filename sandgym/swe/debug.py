"""SWE debug runs: no agent, one scripted step, then the resolved check.

For each task: build or reuse its image, create its sandbox, copy the repository into
/testbed, run one debug step, then `evaluate` (test patch, tests, per-test outcomes).

Steps:
- `none`: nothing; the tests run against base_commit (a good task is unresolved).
- `gold_patch`: apply the task's `patch` (`git apply`, then `patch -p1`).
- `command`: a shell command in /testbed (the CLI's `--command`, else the task's `debug_command`).
- `script`: a script uploaded to the sandbox and run in /testbed (the CLI's `--script` file,
  else the task's `debug_script` text); it runs with its shebang, or bash without one.

`SWEDebugRunner` is what `sandgym swe debug` drives; `SWEDebugEnv` wraps it as a sandgym
environment (reward 1.0 when resolved) so `sandgym eval`-style code can run it too.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from sandgym.core.environment import Environment, error_text
from sandgym.core.rubric import Rubric
from sandgym.core.state import State
from sandgym.sandboxes.spec import SandboxSpec

from .evaluate import SCRATCH, TestReport, apply_patch, evaluate, prepare, run_logged
from .images import ImageBuildError, TaskImageBuilder
from .tasks import TESTBED, SWETask, load_tasks

log = logging.getLogger(__name__)


class DebugStep(str, Enum):
    NONE = "none"
    GOLD_PATCH = "gold_patch"
    COMMAND = "command"
    SCRIPT = "script"


class InstanceResult(BaseModel):
    """Everything a debug run learned about one instance."""

    instance_id: str
    repo: str = ""
    step: str
    status: str = "error"  # resolved | unresolved | error
    resolved: bool = False
    error: str | None = None
    failing_tests: list[str] = Field(default_factory=list)
    fail_to_pass: dict[str, str] = Field(default_factory=dict)
    pass_to_pass: dict[str, str] = Field(default_factory=dict)
    tests: dict[str, str] = Field(default_factory=dict)
    step_exit_code: int | None = None
    test_exit_code: int | None = None
    applied_diff: str = ""
    image: str | None = None
    image_reused: bool | None = None
    logs: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The JSON summary row: no logs, no diff."""
        return self.model_dump(exclude={"logs", "applied_diff", "tests"})


Progress = Callable[[str, str], None]  # (instance_id, phase)


def task_spec(task: SWETask, image: str, *, memory_mb: int = 2048, disk_mb: int = 1024, cpu: float = 1.0) -> SandboxSpec:
    return SandboxSpec(
        image=image, workdir=TESTBED, memory_mb=memory_mb, disk_mb=disk_mb, cpu=cpu, pids=1024,
        env=dict(task.recipe.env), exec_timeout_s=max(120.0, task.recipe.test_timeout_s),
        # Big suites print a lot; the per-test summary comes last and must not be cut off.
        output_limit_bytes=64 << 20,
        labels={"sandgym-swe.instance": task.instance_id[:200]},
    )


class SWEDebugRunner:
    """Runs one debug step over tasks with at most `concurrency` sandboxes at once."""

    def __init__(
        self,
        manager: Any,
        *,
        step: DebugStep | str = DebugStep.GOLD_PATCH,
        builder: TaskImageBuilder | None = None,
        command: str | None = None,
        script: str | None = None,
        progress: Progress | None = None,
        memory_mb: int = 2048,
        disk_mb: int = 1024,
        cpu: float = 1.0,
    ) -> None:
        self.manager = manager
        self.step = DebugStep(step)
        self.builder = builder or TaskImageBuilder()
        self.command = command
        self.script = script
        self.progress = progress or (lambda _i, _p: None)
        self.memory_mb, self.disk_mb, self.cpu = memory_mb, disk_mb, cpu

    async def run(self, tasks: Sequence[SWETask], concurrency: int = 2) -> list[InstanceResult]:
        limit = anyio.CapacityLimiter(max(1, concurrency))
        results: list[InstanceResult | None] = [None] * len(tasks)

        async def one(i: int, task: SWETask) -> None:
            async with limit:
                results[i] = await self.run_one(task)

        async with anyio.create_task_group() as tg:
            for i, t in enumerate(tasks):
                tg.start_soon(one, i, t)
        return [r for r in results if r is not None]

    async def run_one(self, task: SWETask) -> InstanceResult:
        """Never raises for a broken task or a failed build: the result says what happened."""
        res = InstanceResult(instance_id=task.instance_id, repo=task.repo, step=self.step.value)
        t0 = time.perf_counter()
        try:
            self.progress(task.instance_id, "image")
            built = await self.builder.ensure(task)
            res.image, res.image_reused = built.tag, built.reused
            res.timings["image_s"] = built.build_s
            self.progress(task.instance_id, "sandbox")
            t1 = time.perf_counter()
            spec = task_spec(task, built.tag, memory_mb=self.memory_mb, disk_mb=self.disk_mb, cpu=self.cpu)
            async with self.manager.sandbox(spec) as sb:
                res.timings["sandbox_s"] = time.perf_counter() - t1
                base = await prepare(sb, task, res.logs)
                self.progress(task.instance_id, self.step.value)
                t2 = time.perf_counter()
                step_error = await self._run_step(sb, task, res)
                res.timings["step_s"] = time.perf_counter() - t2
                self.progress(task.instance_id, "tests")
                ev = await evaluate(sb, task, res.logs, base=base)
            res.applied_diff = ev.diff
            res.timings.update(ev.timings)
            if ev.report is not None:
                self._take_report(res, ev.report)
            res.error = step_error or ev.error
            if ev.report is None:
                res.status = "error"
            else:
                res.status = "resolved" if res.resolved else "unresolved"
        except ImageBuildError as exc:
            res.status, res.error = "error", str(exc)
            res.logs["image"] = "\n".join(exc.log_tail)
        except Exception as exc:
            log.debug("instance %s failed", task.instance_id, exc_info=True)
            res.status, res.error = "error", error_text(exc)
        res.timings["total_s"] = time.perf_counter() - t0
        self.progress(task.instance_id, "done")
        return res

    @staticmethod
    def _take_report(res: InstanceResult, rep: TestReport) -> None:
        res.resolved = rep.resolved
        res.failing_tests = list(rep.failing)
        res.fail_to_pass, res.pass_to_pass = dict(rep.fail_to_pass), dict(rep.pass_to_pass)
        res.tests = dict(rep.outcomes)
        res.test_exit_code = rep.exit_code

    async def _run_step(self, sb: Any, task: SWETask, res: InstanceResult) -> str | None:
        """Run the step; returns an error note when the step itself failed (the tests still run,
        so the report shows what a half-applied step left)."""
        step = self.step
        if step is DebugStep.NONE:
            return None
        if step is DebugStep.GOLD_PATCH:
            if not task.patch.strip():
                return "the task has no gold patch"
            r = await apply_patch(sb, task.patch, "gold", res.logs, "step")
            res.step_exit_code = r.exit_code
            return None if r.ok else f"the gold patch does not apply (exit {r.exit_code}): {(r.stdout + r.stderr)[-400:]}"
        if step is DebugStep.COMMAND:
            cmd = self.command or task.debug_command
            if not cmd:
                return "step `command` needs --command or the task's `debug_command`"
            r = await run_logged(sb, cmd, res.logs, "step", timeout=task.recipe.test_timeout_s)
            res.step_exit_code = r.exit_code
            return None if r.ok else f"the debug command exited {r.exit_code}"
        if step is DebugStep.SCRIPT:
            text = self.script if self.script is not None else task.debug_script
            if not text:
                return "step `script` needs --script or the task's `debug_script`"
            path = f"{SCRATCH}/debug-script"
            await sb.write_file(path, text, mode=0o755)
            runner = path if text.startswith("#!") else f"bash {path}"
            r = await run_logged(sb, runner, res.logs, "step", timeout=task.recipe.test_timeout_s)
            res.step_exit_code = r.exit_code
            return None if r.ok else f"the debug script exited {r.exit_code}"
        raise ValueError(step)  # pragma: no cover


def broken_report(results: Sequence[InstanceResult]) -> list[dict[str, Any]]:
    """Instances the step did not resolve, with why: for `gold_patch`, the broken tasks."""
    return [
        {"instance_id": r.instance_id, "status": r.status, "failing_tests": r.failing_tests, "error": r.error}
        for r in results if not r.resolved
    ]


def summary(results: Sequence[InstanceResult], step: str, wall_s: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "step": step,
        "total": len(results),
        "resolved": sum(r.resolved for r in results),
        "unresolved": sum(r.status == "unresolved" for r in results),
        "errors": sum(r.status == "error" for r in results),
        "images_built": sum(r.image_reused is False for r in results),
        "images_reused": sum(r.image_reused is True for r in results),
        "instances": [r.summary() for r in results],
        "not_resolved": broken_report(results),
    }
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 3)
    return out


class SWEDebugEnv(Environment):
    """A debug run as an environment: each row is one task; the "rollout" runs the debug
    step (no model is called) and the reward is 1.0 when the task is resolved. Needs
    sandboxes: run inside `env.sandbox_session(...)`. Per-instance results land in
    `state.info["swe"]` (summary) and `state.scratch["swe_result"]` (with logs)."""

    def __init__(
        self,
        tasks: Sequence[SWETask] | str | Path | Any,
        *,
        step: DebugStep | str = DebugStep.GOLD_PATCH,
        command: str | None = None,
        script: str | None = None,
        builder: TaskImageBuilder | None = None,
        **kwargs: Any,
    ) -> None:
        task_list = list(tasks) if isinstance(tasks, (list, tuple)) else load_tasks(tasks)
        self.tasks = {t.instance_id: t for t in task_list}
        self.step = DebugStep(step)
        self.command, self.script = command, script
        self.builder = builder or TaskImageBuilder()
        rows = [task_row(t) for t in task_list]
        rubric = Rubric([resolved_reward])
        kwargs.setdefault("name", "swe_debug")
        # A placeholder spec: images are per task (built on demand); this only asks the
        # session for a SandboxManager.
        kwargs.setdefault("sandbox_spec", SandboxSpec())
        super().__init__(eval_dataset=rows, rubric=rubric, **kwargs)

    def task_for(self, state: State) -> SWETask:
        iid = state.info.get("instance_id")
        if iid not in self.tasks:
            raise KeyError(f"unknown instance {iid!r}")
        return self.tasks[iid]

    async def run_turns(self, client: Any, model: str, state: State, sampling_args: Mapping[str, Any]) -> None:
        task = self.task_for(state)
        runner = SWEDebugRunner(self.require_sandboxes(), step=self.step, builder=self.builder,
                                command=self.command, script=self.script)
        res = await runner.run_one(task)
        state.scratch["swe_result"] = res
        state.info["swe"] = res.summary()
        state.completion = [{"role": "assistant", "content": f"[{self.step.value}]\n{res.applied_diff}"}]
        state.stop_reason = "debug_step"
        if res.status == "error" and not res.tests:
            raise RuntimeError(res.error or "debug run failed")


def task_row(task: SWETask) -> dict[str, Any]:
    text = task.problem_statement or f"Resolve {task.instance_id} in {task.repo}."
    return {"prompt": [{"role": "user", "content": text}], "answer": task.patch,
            "info": json.dumps({"instance_id": task.instance_id, "repo": task.repo}), "task": task.instance_id}


def resolved_reward(state: State) -> float:
    res = state.scratch.get("swe_result")
    return 1.0 if res is not None and res.resolved else 0.0
