"""Validation mode: is each task sound? Gold patch and empty patch on every instance, N
times each, the way a benchmark's release gate checks it (SWE-bench Pro): the gold patch
resolves it every time, the empty patch never does, its FAIL_TO_PASS tests fail and its
PASS_TO_PASS tests pass without the fix, and no test changes outcome between re-runs of
the same step (flaky). Each run is a debug run written to the store as it finishes
(`<instance>/<step>-<k>/`), so a killed validation resumes where it stopped.

An instance's runs go one after another (gold 1, empty 1, gold 2, ...) while instances run
side by side: the first run builds the image (cold seconds), the later ones reuse it
(warm seconds), and neither waits on another instance's build.

Tests that fail only because the sandbox has no network (sandgym.swe.network) are not the
task's fault: an instance whose only problems are those gets the verdict `needs_network`
(with the tests named), not `invalid`; with a network (--network-allow) it can be validated.
An instance none of whose runs got as far as a sandbox (no recipe this machine can build,
the image build or the repository failed) says nothing about the task either: `not_run`,
with the reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from pydantic import BaseModel, Field

from .debug import InstanceResult, SWEDebugRunner
from .store import RunStore
from .tasks import SWETask

STEPS = ("gold_patch", "none")
PASSING = ("passed", "xfail")


class InstanceValidation(BaseModel):
    instance_id: str
    repo: str = ""
    version: str = ""
    python: str | None = None
    runs: int = 0
    gold_resolved: int = 0  # runs of the gold patch that resolved the instance
    empty_resolved: int = 0  # runs of the empty patch that did (should be 0)
    infra: int = 0  # runs that failed for the environment's reasons (but the network)
    network: int = 0  # runs whose failing tests all needed the network (infra, reason network)
    network_tests: list[str] = Field(default_factory=list)  # listed tests that failed on a network error
    errors: int = 0
    f2p_passing_without_fix: list[str] = Field(default_factory=list)
    p2p_failing_without_fix: list[str] = Field(default_factory=list)
    gold_failing: list[str] = Field(default_factory=list)  # listed tests the gold patch did not pass
    gold_errors: list[str] = Field(default_factory=list)  # why gold runs could not be graded (the patch does not apply, ...)
    flaky_listed: list[str] = Field(default_factory=list)  # FAIL_TO_PASS / PASS_TO_PASS ids whose outcome changed
    flaky_other: int = 0  # other reported tests whose outcome changed
    cold_s: float | None = None  # the run that built the image
    cold_step: str | None = None  # which step that run was
    gold_warm_s: float | None = None  # mean of gold runs on a reused image
    empty_warm_s: float | None = None
    verdict: str = "invalid"  # valid | needs_network | not_run | invalid
    problems: list[str] = Field(default_factory=list)


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 2) if xs else None


def judge(task: SWETask, results: dict[str, list[dict[str, Any]]]) -> InstanceValidation:
    """The verdict from an instance's runs (`results[step]` = result dicts in run order)."""
    gold, empty = results.get("gold_patch", []), results.get("none", [])
    every = gold + empty
    v = InstanceValidation(instance_id=task.instance_id, repo=task.repo, version=task.version, runs=len(gold),
                           python=next((r.get("python") for r in every if r.get("python")), None))
    v.gold_resolved = sum(bool(r.get("resolved")) for r in gold)
    v.empty_resolved = sum(bool(r.get("resolved")) for r in empty)
    v.network = sum(r.get("infra_reason") == "network" for r in every)
    v.infra = sum(r.get("status") == "infra" for r in every) - v.network
    v.errors = sum(r.get("status") == "error" for r in every)
    v.network_tests = sorted({t for r in every for t in r.get("network_tests") or {}})
    net = set(v.network_tests)
    graded_empty = [r for r in empty if r.get("status") in ("resolved", "unresolved") or r.get("infra_reason") == "network"]
    v.f2p_passing_without_fix = sorted({t for r in graded_empty for t, o in r.get("fail_to_pass", {}).items() if o in PASSING})
    v.p2p_failing_without_fix = sorted({t for r in graded_empty for t, o in r.get("pass_to_pass", {}).items()
                                        if o not in PASSING and t not in net})
    v.gold_failing = sorted({t for r in gold if r.get("status") in ("resolved", "unresolved") for t in r.get("failing_tests", [])})
    v.gold_errors = sorted({str(r["error"]).splitlines()[0][:400] for r in gold if r.get("status") == "error" and r.get("error")})
    listed = set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS)
    flaky: set[str] = set()
    for runs in (gold, empty):
        graded = [r.get("tests", {}) for r in runs if r.get("status") in ("resolved", "unresolved")]
        if len(graded) < 2:
            continue
        for t in set().union(*graded):
            if len({g.get(t, "missing") for g in graded}) > 1:
                flaky.add(t)
    v.flaky_listed = sorted(flaky & listed)
    v.flaky_other = len(flaky - listed)
    built = [r for r in every if r.get("image_reused") is False]
    v.cold_s = round(built[0]["timings"]["total_s"], 2) if built else None
    v.cold_step = built[0].get("step") if built else None
    v.gold_warm_s = _mean([r["timings"]["total_s"] for r in gold if r.get("image_reused") is True])
    v.empty_warm_s = _mean([r["timings"]["total_s"] for r in empty if r.get("image_reused") is True])
    if v.infra:
        v.problems.append(f"{v.infra} run(s) failed for infrastructure reasons")
    if v.errors:
        v.problems.append(f"{v.errors} run(s) could not be graded")
    gold_network = sum(r.get("infra_reason") == "network" for r in gold)
    if v.gold_resolved + gold_network < len(gold):
        why = v.gold_errors[:2] + ([f"failing: {', '.join(v.gold_failing[:5])}"] if v.gold_failing else [])
        v.problems.append(f"gold resolved {v.gold_resolved}/{len(gold)} runs" + (f" ({'; '.join(why)})" if why else ""))
    if v.empty_resolved:
        v.problems.append(f"the empty patch resolved {v.empty_resolved}/{len(empty)} runs")
    if v.f2p_passing_without_fix:
        v.problems.append(f"{len(v.f2p_passing_without_fix)} FAIL_TO_PASS test(s) pass without the fix")
    if v.p2p_failing_without_fix:
        v.problems.append(f"{len(v.p2p_failing_without_fix)} PASS_TO_PASS test(s) fail without the fix")
    if v.flaky_listed:
        v.problems.append(f"{len(v.flaky_listed)} listed test(s) changed outcome between runs")
    reached = [r for r in every if "sandbox_s" in (r.get("timings") or {})]
    if every and not reached:
        v.verdict = "not_run"
        first = next((str(r["error"]).splitlines()[0][:400] for r in every if r.get("error")), "no run got a sandbox")
        v.problems = [f"no run got as far as a sandbox: {first}"]
    elif v.problems or not (gold and empty):
        v.verdict = "invalid"
    elif v.network:
        v.verdict = "needs_network"
        v.problems.append(f"{len(v.network_tests)} test(s) need the network, which the sandbox does not have: "
                          f"{', '.join(v.network_tests[:5])}; gold resolved {v.gold_resolved}/{len(gold)} runs without it")
    else:
        v.verdict = "valid"
    return v


def run_key(task: SWETask, step: str, k: int) -> str:
    return f"{task.instance_id}/{step}-{k}"


def _fixed_key(key: str) -> Callable[[SWETask], str]:
    """A debug runner's key function that stores its one run under `key`."""
    return lambda _task: key


class Validator:
    def __init__(self, manager: Any, *, builder: Any, store: RunStore, runs: int = 1,
                 progress: Callable[[str, str], None] | None = None, steps: Sequence[str] = STEPS, **runner_kw: Any) -> None:
        if runs < 1:
            raise ValueError("runs must be at least 1")
        if sorted(steps) != sorted(STEPS):
            raise ValueError(f"steps must be an order of {STEPS}")
        self.manager, self.builder, self.store, self.runs = manager, builder, store, runs
        self.steps = tuple(steps)  # the order of an instance's runs (the first one builds the image)
        self.progress = progress or (lambda _i, _p: None)
        self.runner_kw = runner_kw

    async def run(self, tasks: Sequence[SWETask], concurrency: int = 2) -> list[InstanceValidation]:
        limit = anyio.CapacityLimiter(max(1, concurrency))
        out: list[InstanceValidation | None] = [None] * len(tasks)
        async def one(i: int, task: SWETask) -> None:
            async with limit:
                results: dict[str, list[dict[str, Any]]] = {s: [] for s in STEPS}
                for k in range(1, self.runs + 1):
                    for step in self.steps:
                        key = run_key(task, step, k)
                        done = self.store.load(key)
                        if done is None:
                            runner = SWEDebugRunner(self.manager, step=step, builder=self.builder, store=self.store,
                                                    progress=self.progress, key=_fixed_key(key), **self.runner_kw)
                            res: InstanceResult = await runner.run_one(task)
                            done = res.record()
                        results[step].append(done)
                out[i] = judge(task, results)

        async with anyio.create_task_group() as tg:
            for i, t in enumerate(tasks):
                tg.start_soon(one, i, t)
        return [v for v in out if v is not None]


def validation_summary(vals: Sequence[InstanceValidation], runs: int, wall_s: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "validate", "runs": runs, "total": len(vals),
        "valid": sum(v.verdict == "valid" for v in vals),
        "needs_network": [{"instance_id": v.instance_id, "tests": v.network_tests} for v in vals if v.verdict == "needs_network"],
        "not_run": [{"instance_id": v.instance_id, "problems": v.problems} for v in vals if v.verdict == "not_run"],
        "invalid": [{"instance_id": v.instance_id, "problems": v.problems} for v in vals if v.verdict == "invalid"],
        "instances": [v.model_dump() for v in vals],
    }
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 3)
    return out
