"""SWE debug runs: no agent, one scripted step, then the resolved check.

For each task: resolve its recipe, build or reuse its image (or take SWE-bench's prebuilt
instance image: `image_source` below), create its sandbox, ready /testbed, run one debug
step, then `evaluate` (test patch, tests, graded as SWE-bench grades).

Image sources: `build` (default; task images built here, offline), `prebuilt` (SWE-bench's
published instance image, local or pulled through the sandbox provider, from Docker Hub or
`PrebuiltImages.registry`; sandgym.swe.prebuilt) and `auto` (prebuilt where it can be had,
else built here: a failed pull, or a row with no instance image, falls back to building and
the result says why in `image_fallback`). Only the image, the sandbox profile and user,
PATH and the conda activation differ between them (`ImageLayout`); the step, the test
patch, the tests and the grading are the same code.

Steps:
- `none`: nothing; the tests run against base_commit (a good task is unresolved).
- `gold_patch`: apply the task's `patch` (reversed for SWE-smith rows, whose `patch` is the
  bug) as SWE-bench's harness does: `git apply`, and when git refuses a well-formed patch,
  `patch --fuzz=5 -p1` (tried dry first). A patch that does not apply is an `error` with
  git's message and no test run; a corrupt one (cut short) is never fuzzed on; a fuzzy
  apply is recorded (`patches`, with patch's notes) and shown. The test patch goes on the
  same way.
- `command`: a shell command in /testbed (the CLI's `--command`, else the task's `debug_command`).
- `script`: a script uploaded to the sandbox and run in /testbed (the CLI's `--script` file,
  else the task's `debug_script`text); it runs with its shebang, or bash without one.

An instance ends in one status: `resolved`, `unresolved` (the tests ran and were graded),
`error` (the task cannot be run or graded as given: no recipe, the test patch does not
apply, nothing parseable in the log) or `infra` (the environment failed: image build,
image pull, repository, sandbox, setup, test timeout, output cap, a crash of the harness), with
`infra_reason`; infra failures are reported apart from unresolved ones, as SWE-bench's
newer harness does. Tests that failed only because the sandbox has no network
(sandgym.swe.network says how that is known) make an instance `infra` with reason `network`
when they are all that failed, and are named in `network_tests` either way. A crash in one instance marks that instance, never the run, and with
a store each instance is written to disk the moment it finishes.

`SWEDebugRunner` is what `sandgym swe debug` drives; `SWEDebugEnv` wraps it as a sandgym
environment (reward 1.0 when resolved) so `sandgym eval`-style code can run it too.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from sandgym.core.environment import Environment
from sandgym.core.failures import error_text
from sandgym.core.rubric import Rubric
from sandgym.core.state import State
from sandgym.sandboxes.errors import ImagePullError, SandboxError, SpecError
from sandgym.sandboxes.spec import EgressPolicy, SandboxSpec

from .evaluate import SCRATCH, PatchApply, TestReport, apply_patch, evaluate, prepare, run_logged
from .images import (
    BUILT_LAYOUT,
    BaseImageError,
    ImageBuildError,
    ImageLayout,
    ImageSourceError,
    RepoError,
    TaskImageBuilder,
)
from .network import network_failures
from .prebuilt import PREBUILT_LAYOUT, PrebuiltImages
from .store import RunStore
from .tasks import TESTBED, MissingRepository, RecipeError, SWETask, load_tasks

log = logging.getLogger(__name__)

STATUSES = ("resolved", "unresolved", "error", "infra")
IMAGE_SOURCES = ("build", "prebuilt", "auto")
NETWORK_ERROR = ("the task asks for network access at test time (network: true); allow the hosts it needs with "
                 "--network-allow HOST[,HOST...] (e.g. pypi.org,files.pythonhosted.org); without it the task is refused")


def network_policy(task: SWETask, allow: Sequence[str] | None, *, every_row: bool = False) -> EgressPolicy | None:
    """The egress a task's sandbox gets: none unless the row asks for network (off by
    default) or the operator gives it to every row (`every_row`, with an allow-list), then
    exactly the operator's allow-list; a row asking with no list is refused."""
    if every_row and allow:
        return EgressPolicy(allow=tuple(allow))
    if not task.network:
        return None
    if not allow:
        raise RecipeError(NETWORK_ERROR)
    return EgressPolicy(allow=tuple(allow))


class DebugStep(str, Enum):
    NONE = "none"
    GOLD_PATCH = "gold_patch"
    COMMAND = "command"
    SCRIPT = "script"


class InstanceResult(BaseModel):
    """Everything a debug run learned about one instance."""

    instance_id: str
    repo: str = ""
    version: str = ""
    step: str
    status: str = "error"  # resolved | unresolved | error | infra
    resolved: bool = False
    resolution: str | None = None  # swebench's RESOLVED_FULL / PARTIAL / NO
    error: str | None = None
    infra_reason: str | None = None  # image_build, image_pull, repository, base_image, sandbox, setup, timeout, output_cap, network, crash
    network_tests: dict[str, str] = Field(default_factory=dict)  # failing listed test -> the log line showing its network error
    failing_tests: list[str] = Field(default_factory=list)
    fail_to_pass: dict[str, str] = Field(default_factory=dict)
    pass_to_pass: dict[str, str] = Field(default_factory=dict)
    tests_status: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    tests: dict[str, str] = Field(default_factory=dict)
    parser: str | None = None
    graded_by: str | None = None
    step_exit_code: int | None = None
    test_exit_code: int | None = None
    patches: dict[str, PatchApply] = Field(default_factory=dict)  # "gold", "test_patch": how each went on
    applied_diff: str = ""
    image: str | None = None
    image_reused: bool | None = None  # a task image built here: found (True) or built (False)
    image_source: str | None = None  # build | prebuilt: where the image the tests ran in came from
    image_fallback: str | None = None  # auto: why the prebuilt image was not used (then it was built)
    python: str | None = None
    recipe_source: str | None = None
    recipe_notes: list[str] = Field(default_factory=list)
    logs: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The JSON summary row: no logs, no diff, no per-test table."""
        return self.model_dump(exclude={"logs", "applied_diff", "tests", "tests_status"})

    def record(self) -> dict[str, Any]:
        """What result.json holds: everything but the logs (they are files of their own)."""
        return self.model_dump(exclude={"logs"})


Progress = Callable[[str, str], None]  # (instance_id, phase)


def task_spec(
    task: SWETask, image: str, *, memory_mb: int = 2048, disk_mb: int = 1024, cpu: float = 1.0,
    egress: EgressPolicy | None = None, layout: ImageLayout = BUILT_LAYOUT,
) -> SandboxSpec:
    recipe = task.require_recipe()
    return SandboxSpec(
        egress=egress, profile=layout.profile, user=layout.user,
        image=image, workdir=TESTBED, memory_mb=memory_mb, disk_mb=disk_mb, cpu=cpu, pids=1024,
        env={**dict(layout.env), **recipe.env}, exec_timeout_s=max(120.0, recipe.test_timeout_s),
        # Big suites print a lot; the per-test summary comes last and must not be cut off.
        output_limit_bytes=64 << 20,
        labels={"sandgym-swe.instance": task.instance_id[:200]},
    )


class _NoTests(Exception):
    """The step leaves nothing to test (a gold patch that does not apply): SWE-bench calls
    that an error and runs no tests."""


class _Infra(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SWEDebugRunner:
    """Runs one debug step over tasks with at most `concurrency` sandboxes at once.

    `image_source`: `build` (task images built here, offline), `prebuilt` (SWE-bench's
    instance images, named and found as `prebuilt` says: registry, namespace; a failed pull
    is an `image_pull` infra failure of that instance) or `auto` (prebuilt, falling back to
    building). Rows with `network: true` get `network_allow` as their egress allow-list
    (refused without one). With a `store`, each result is saved as soon as it finishes."""

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
        image_source: str = "build",
        store: RunStore | None = None,
        key: Callable[[SWETask], str] | None = None,
        network_allow: Sequence[str] | None = None,
        network_every_row: bool = False,
        prebuilt: PrebuiltImages | None = None,
    ) -> None:
        if network_allow:
            EgressPolicy(allow=tuple(network_allow))  # a bad entry fails here, naming it
        if image_source not in IMAGE_SOURCES:
            raise ValueError(f"image_source must be one of {', '.join(IMAGE_SOURCES)}, not {image_source!r}")
        self.manager = manager
        self.step = DebugStep(step)
        self.builder = builder or TaskImageBuilder()
        self.command = command
        self.script = script
        self.progress = progress or (lambda _i, _p: None)
        self.memory_mb, self.disk_mb, self.cpu = memory_mb, disk_mb, cpu
        self.image_source = image_source
        self.store = store
        self.key = key or (lambda t: t.instance_id)
        self.network_allow = tuple(network_allow or ())
        self.network_every_row = network_every_row
        self.prebuilt = prebuilt or PrebuiltImages()

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
        """Never raises for a broken task, a failed build or a harness crash: the result
        says what happened (and is on disk, with a store, before this returns)."""
        res = InstanceResult(instance_id=task.instance_id, repo=task.repo, version=task.version, step=self.step.value)
        t0 = time.perf_counter()
        try:
            await self._run(task, res)
        except _Infra as exc:
            res.status, res.infra_reason, res.error = "infra", exc.reason, str(exc)
        except (RecipeError, ImageSourceError) as exc:
            res.status, res.error = "error", str(exc)
        except Exception as exc:  # a harness bug must not take the other instances down
            log.debug("instance %s crashed", task.instance_id, exc_info=True)
            res.status, res.infra_reason, res.error = "infra", "crash", f"harness crash: {error_text(exc)}"
            res.logs["crash"] = traceback.format_exc()
        if res.image_fallback and res.status in ("error", "infra") and res.error:
            res.error += f" (building it after the prebuilt image was unavailable: {res.image_fallback.splitlines()[0]})"
        res.timings["total_s"] = time.perf_counter() - t0
        if self.store is not None:
            self.store.save(self.key(task), res.record(), res.logs, res.applied_diff)
        self.progress(task.instance_id, "done")
        return res

    async def _run(self, task: SWETask, res: InstanceResult) -> None:
        egress = network_policy(task, self.network_allow, every_row=self.network_every_row)
        if self.image_source != "build":
            try:
                await self._run_prebuilt(task, res, egress)
                return
            except (ImageSourceError, ImagePullError) as exc:
                if self.image_source == "prebuilt":
                    if isinstance(exc, ImagePullError):
                        raise _Infra("image_pull", error_text(exc)) from exc
                    raise
                # auto: build it here instead, saying why
                res.image_fallback = error_text(exc)
                res.logs["prebuilt"] = res.image_fallback + "\n"
                res.image = res.image_source = None
                self.progress(task.instance_id, "fallback: build")
        task = self._resolve(task, res, prebuilt=False)
        self.progress(task.instance_id, "image")
        try:
            built = await self.builder.ensure(task)
        except ImageBuildError as exc:
            res.logs["image"] = "\n".join(exc.log_tail)
            raise _Infra("image_build", str(exc)) from exc
        except BaseImageError as exc:
            raise _Infra("base_image", str(exc)) from exc
        except (RepoError, FileNotFoundError) as exc:
            raise _Infra("repository", str(exc)) from exc
        res.image, res.image_reused, res.image_source = built.tag, built.reused, "build"
        res.timings["image_s"] = built.build_s
        try:
            await self._in_sandbox(task, res, built.tag, BUILT_LAYOUT, egress)
        except ImagePullError as exc:  # a built image is local: cannot happen, unless removed meanwhile
            raise _Infra("sandbox", error_text(exc)) from exc

    def _resolve(self, task: SWETask, res: InstanceResult, *, prebuilt: bool) -> SWETask:
        """The task with its recipe (a RecipeError when it has none), recorded in `res`."""
        try:
            task = self.builder.resolve(task, prebuilt=prebuilt)
        except MissingRepository as exc:
            raise _Infra("repository", str(exc)) from exc
        recipe = task.require_recipe()
        res.python, res.recipe_source, res.recipe_notes = recipe.python, recipe.source, list(recipe.notes)
        return task

    async def _run_prebuilt(self, task: SWETask, res: InstanceResult, egress: EgressPolicy | None) -> None:
        """The task in SWE-bench's instance image (pulled by the provider when missing).
        Raises ImageSourceError / ImagePullError when that image cannot be had."""
        image = self.prebuilt.image(task)
        task = self._resolve(task, res, prebuilt=True)
        res.image, res.image_source = image, "prebuilt"
        self.progress(task.instance_id, "image (prebuilt)")
        await self._in_sandbox(task, res, image, PREBUILT_LAYOUT, egress)

    async def _in_sandbox(self, task: SWETask, res: InstanceResult, image: str, layout: ImageLayout,
                          egress: EgressPolicy | None) -> None:
        """Create the sandbox (`sandbox_s` includes a pull of a missing image), ready
        /testbed, run the step, evaluate. ImagePullError passes through: the caller decides."""
        self.progress(task.instance_id, "sandbox")
        t1 = time.perf_counter()
        spec = task_spec(task, image, memory_mb=self.memory_mb, disk_mb=self.disk_mb, cpu=self.cpu, egress=egress,
                         layout=layout)
        try:
            async with self.manager.sandbox(spec) as sb:
                res.timings["sandbox_s"] = time.perf_counter() - t1
                try:
                    base = await prepare(sb, task, res.logs, layout)
                except RuntimeError as exc:
                    raise _Infra("setup", str(exc)) from exc
                self.progress(task.instance_id, self.step.value)
                t2 = time.perf_counter()
                try:
                    step_error = await self._run_step(sb, task, res)
                except _NoTests as exc:
                    res.timings["step_s"] = time.perf_counter() - t2
                    res.status, res.error = "error", str(exc)
                    return
                res.timings["step_s"] = time.perf_counter() - t2
                self.progress(task.instance_id, "tests")
                ev = await evaluate(sb, task, res.logs, base=base, layout=layout)
                if egress is not None:  # what the task's network use was, allowed or not
                    entries = await sb.egress_log()
                    res.logs["egress"] = "".join(e.model_dump_json() + "\n" for e in entries)
        except ImagePullError:
            raise
        except SpecError as exc:  # e.g. the vm profile without gVisor, refused before anything ran
            raise _Infra("sandbox", f"the sandbox was refused: {error_text(exc)}") from exc
        except SandboxError as exc:
            raise _Infra("sandbox", f"sandbox failure: {error_text(exc)}") from exc
        res.applied_diff = ev.diff
        res.timings.update(ev.timings)
        if ev.test_patch is not None:
            res.patches["test_patch"] = ev.test_patch
        if ev.report is not None:
            self._take_report(res, ev.report)
        res.error = step_error or ev.error
        if ev.report is not None and ev.report.outcomes and not res.resolved:
            res.network_tests = network_failures(res.logs.get("tests", ""), ev.report.failing)
        if ev.infra:
            res.status, res.infra_reason = "infra", ev.infra
        elif ev.report is None or not ev.report.outcomes:
            res.status = "error"
        elif res.network_tests and set(res.failing_tests) <= set(res.network_tests):
            res.status, res.infra_reason = "infra", "network"
            res.error = network_error(res.network_tests, egress is not None)
        else:
            res.status = "resolved" if res.resolved else "unresolved"

    @staticmethod
    def _take_report(res: InstanceResult, rep: TestReport) -> None:
        res.resolved = rep.resolved
        res.resolution = rep.resolution
        res.failing_tests = list(rep.failing)
        res.fail_to_pass, res.pass_to_pass = dict(rep.fail_to_pass), dict(rep.pass_to_pass)
        res.tests_status = rep.tests_status
        res.tests = dict(rep.outcomes)
        res.test_exit_code = rep.exit_code
        res.parser, res.graded_by = rep.parser, rep.graded_by

    async def _run_step(self, sb: Any, task: SWETask, res: InstanceResult) -> str | None:
        """Run the step; returns an error note when a command or script step failed (the
        tests still run, so the report shows what it left). A gold patch that is missing or
        does not apply raises _NoTests: nothing of it is in the tree, so there is nothing to test."""
        step = self.step
        recipe = task.require_recipe()
        if step is DebugStep.NONE:
            return None
        if step is DebugStep.GOLD_PATCH:
            if not task.patch.strip():
                raise _NoTests("the task has no gold patch")
            applied = res.patches["gold"] = await apply_patch(sb, task.patch, "gold", res.logs, "step", reverse=task.gold_reverse)
            res.step_exit_code = applied.exit_code
            if not applied.ok:
                raise _NoTests(f"the gold patch does not apply: {applied.error}")
            return None
        if step is DebugStep.COMMAND:
            cmd = self.command or task.debug_command
            if not cmd:
                return "step `command` needs --command or the task's `debug_command`"
            r = await run_logged(sb, cmd, res.logs, "step", timeout=recipe.test_timeout_s)
            res.step_exit_code = r.exit_code
            return None if r.ok else f"the debug command exited {r.exit_code}"
        if step is DebugStep.SCRIPT:
            text = self.script if self.script is not None else task.debug_script
            if not text:
                return "step `script` needs --script or the task's `debug_script`"
            path = f"{SCRATCH}/debug-script"
            await sb.write_file(path, text, mode=0o755)
            runner = path if text.startswith("#!") else f"bash {path}"
            r = await run_logged(sb, runner, res.logs, "step", timeout=recipe.test_timeout_s)
            res.step_exit_code = r.exit_code
            return None if r.ok else f"the debug script exited {r.exit_code}"
        raise ValueError(step)  # pragma: no cover


def network_error(tests: Mapping[str, str], had_network: bool) -> str:
    """The error of an instance whose failing tests all needed the network."""
    names = ", ".join(list(tests)[:5]) + (f" and {len(tests) - 5} more" if len(tests) > 5 else "")
    first = next(iter(tests.values()))
    if had_network:
        return (f"{len(tests)} test(s) failed on a network error although the sandbox had an allow-list: {names} "
                f"({first}); the hosts they reach are not in --network-allow (see the instance's egress log)")
    return (f"{len(tests)} test(s) need the network, which the sandbox does not have: {names} ({first}); SWE-bench "
            f"runs them with a network: give them one with --network-allow HOST[,HOST...] --network-rows all, "
            f"or `network: true` on the row")


def fuzzy_notes(result: Mapping[str, Any]) -> list[str]:
    """One line per patch of a result (dict) that went on by the fuzzy fallback."""
    notes = []
    for what, applied in (result.get("patches") or {}).items():
        note = PatchApply.model_validate(applied).note("the gold patch" if what == "gold" else f"the {what.replace('_', ' ')}")
        if note is not None:
            notes.append(note)
    return notes


def broken_report(results: Sequence[Any]) -> list[dict[str, Any]]:
    """Instances the step did not resolve, with why (the error, e.g. the patch that does not
    apply, and the failing tests): for `gold_patch`, the broken tasks (infra failures are
    listed apart: they say nothing about the task)."""
    rows = [_as_dict(r) for r in results]
    return [
        {"instance_id": r["instance_id"], "status": r["status"], "failing_tests": r.get("failing_tests", []), "error": r.get("error"),
         "fuzzy": fuzzy_notes(r)}
        for r in rows if not r.get("resolved") and r.get("status") != "infra"
    ]


def _as_dict(r: Any) -> dict[str, Any]:
    return r.summary() if isinstance(r, InstanceResult) else dict(r)


def summary(results: Sequence[Any], step: str, wall_s: float | None = None) -> dict[str, Any]:
    """The run's summary over InstanceResults or result.json dicts (a resumed run mixes both)."""
    rows = [_as_dict(r) for r in results]
    out: dict[str, Any] = {
        "step": step,
        "total": len(rows),
        "resolved": sum(bool(r.get("resolved")) for r in rows),
        "unresolved": sum(r.get("status") == "unresolved" for r in rows),
        "errors": sum(r.get("status") == "error" for r in rows),
        "infra": sum(r.get("status") == "infra" for r in rows),
        "images_built": sum(r.get("image_reused") is False for r in rows),
        "images_reused": sum(r.get("image_reused") is True for r in rows),
        "images_prebuilt": sum(r.get("image_source") == "prebuilt" for r in rows),
        "prebuilt_fallbacks": sum(bool(r.get("image_fallback")) for r in rows),
        "instances": [{k: v for k, v in r.items() if k not in ("logs", "applied_diff", "tests", "tests_status")} for r in rows],
        "not_resolved": broken_report(rows),
        "infra_failures": [{"instance_id": r["instance_id"], "reason": r.get("infra_reason"), "error": r.get("error")}
                           for r in rows if r.get("status") == "infra"],
        "network": sum(r.get("infra_reason") == "network" for r in rows),
        "network_tests": {r["instance_id"]: sorted(r["network_tests"]) for r in rows if r.get("network_tests")},
        "fuzzy_applies": [{"instance_id": r["instance_id"], "notes": fuzzy_notes(r)} for r in rows if fuzzy_notes(r)],
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
        if res.status in ("error", "infra") and not res.tests:
            raise RuntimeError(res.error or "debug run failed")


def task_row(task: SWETask) -> dict[str, Any]:
    text = task.problem_statement or f"Resolve {task.instance_id} in {task.repo}."
    return {"prompt": [{"role": "user", "content": text}], "answer": task.patch,
            "info": json.dumps({"instance_id": task.instance_id, "repo": task.repo}), "task": task.instance_id}


def resolved_reward(state: State) -> float:
    res = state.scratch.get("swe_result")
    return 1.0 if res is not None and res.resolved else 0.0
