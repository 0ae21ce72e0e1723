"""Judging a solution: every test of a problem in one exec of the in-sandbox harness."""

from __future__ import annotations

import json
from typing import Any

from sandgym.core.failures import ScoringTimeout
from sandgym.core.marked import marked_json
from sandgym.core.sandbox_env import checked_exec

from .model import JudgeResult, Problem, TestResult
from .program import harness_program, zygote_program
from .sandbox_harness import MARK


def judge_request(
    code: str,
    problem: Problem,
    *,
    stop_on_first_failure: bool = True,
    output_limit_bytes: int = 8 << 20,
    wall_factor: float = 2.0,
) -> dict[str, Any]:
    return {
        "code": code,
        "kind": problem.kind,
        "fn_name": problem.fn_name,
        "tests": [t.model_dump() for t in problem.tests],
        "time_limit_s": problem.time_limit_s,
        "memory_mb": problem.memory_mb,
        "compare": problem.compare,
        "float_tol": problem.float_tol,
        "unwrap_list_answer": problem.unwrap_list_answer,
        "checker": problem.checker,
        "stop_on_first_failure": stop_on_first_failure,
        "output_limit_bytes": output_limit_bytes,
        "wall_factor": wall_factor,
        "zygote": zygote_program(),
    }


def time_budget(problem: Problem, wall_factor: float = 2.0) -> float:
    """The longest the whole exec may take: every test at its wall limit, plus start-up."""
    return len(problem.tests) * (problem.time_limit_s * wall_factor + 1.5) + 60.0


def parse_result(stdout: str, stderr: str, exit_code: int) -> JudgeResult:
    doc = marked_json(stdout, MARK)
    if doc is not None:
        tests = [TestResult(**t) for t in doc["tests"]]
        passed = sum(1 for t in tests if t.verdict == "AC")
        first_bad = next((t.verdict for t in tests if t.verdict != "AC"), "AC")
        return JudgeResult(
            verdict=first_bad, passed=passed, total=len(tests), tests=tests,
            compile_error=doc.get("compile_error") or "", wall_s=float(doc.get("wall_s") or 0.0),
        )  # fmt: skip
    detail = (stderr or stdout)[-1500:] or f"exit {exit_code}"
    return JudgeResult(verdict="JE", passed=0, total=0, tests=[TestResult(verdict="JE", detail=detail)])


async def judge(sandbox: Any, code: str, problem: Problem, **options: Any) -> JudgeResult:
    """Run `code` on every test of `problem` in `sandbox` (one exec)."""
    if not problem.tests:
        raise ValueError(f"problem {problem.id} has no tests")
    req = judge_request(code, problem, **options)
    budget = time_budget(problem, req["wall_factor"])
    r = await checked_exec(sandbox, ["python3", "-I", "-c", harness_program()], timeout=budget, stdin=json.dumps(req))
    if r.timed_out:
        # Every test has its own limits inside the budget: a judge past it was starved.
        raise ScoringTimeout(f"judging {problem.id} ran past its {budget:g}s budget ({len(problem.tests)} tests): "
                             "the machine was too loaded to judge")
    return parse_result(r.stdout, r.stderr, r.exit_code)
