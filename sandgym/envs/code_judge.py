"""code_judge: competitive programming, judged test by test in one sandbox exec per answer.

The model answers with a Python program in a fenced block (stdin/stdout problems) or a
completion of the starter code (call problems: `class Solution` methods, LeetCode style, or
a top-level function, APPS style). The judge (sandgym.judge) runs every test of the problem
in ONE exec inside a sandbox: a fork server starts each test in a fresh child with the
problem's time and memory limits and an output cap, and compares (exact, lines, whitespace,
float tolerance, or the problem's own checker). Sandboxes serve only the judging and are
reused between answers (reset in between).

Problems: `source="builtin"` (default) is a small self-written set shipped in the package
(sandgym.judge.problemset); otherwise a local .jsonl/.json/.parquet file or a Hugging Face
dataset name in LiveCodeBench, DeepCoder, CodeContests, TACO or APPS layout (`format=`,
detected when omitted; `name=` the dataset config, `split=`).

Reward: 1 when every test passes; with `reward="partial"` the fraction of tests passed
(then `stop_on_first_failure=False` so every test runs). Metrics: `tests_passed_fraction`
and one per verdict of the first failing test (`verdict_WA`, `verdict_TLE`, ...).

The oracle answers with the problem's reference solution (problems without one get an
empty answer); the null policy answers with no code.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sandgym.core.environment import SingleTurnEnv
from sandgym.core.parsers import CodeBlockParser
from sandgym.core.rubric import Rubric
from sandgym.core.state import Message, State
from sandgym.judge.formats import load_problems
from sandgym.judge.judge import judge
from sandgym.judge.model import Problem
from sandgym.judge.problemset import problems as builtin_problems
from sandgym.sandboxes.spec import SandboxSpec, host_cpus

VERDICTS = ("AC", "WA", "TLE", "MLE", "RE", "OLE", "CE", "JE")

STDIN_PROMPT = (
    "Solve the following competitive programming problem in Python 3. The program reads from "
    "standard input and writes to standard output. Reply with the complete program in a single "
    "```python fenced code block.\n\n{statement}"
)
CALL_PROMPT = (
    "Solve the following problem in Python 3. Complete the starter code below (keep its names "
    "and signatures) and reply with the complete code in a single ```python fenced code block."
    "\n\n{statement}\n\nStarter code:\n```python\n{starter}\n```"
)


def prompt_of(p: Problem) -> str:
    if p.kind == "call":
        starter = p.starter_code or f"def {p.fn_name}(*args):\n    ..."
        return CALL_PROMPT.format(statement=p.statement, starter=starter)
    return STDIN_PROMPT.format(statement=p.statement)


class CodeJudgeEnv(SingleTurnEnv):
    def __init__(self, *args: Any, problems: dict[str, Problem], judge_options: dict[str, Any], partial: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.problems = problems
        self.judge_options = judge_options
        self.partial = partial

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        p = self.problems[state.info["problem_id"]]
        code = p.solutions[0] if p.solutions else ""
        return {"role": "assistant", "content": f"```python\n{code.rstrip()}\n```" if code else "I have no solution."}

    @asynccontextmanager
    async def sandbox_session(
        self, provider: Any = "docker", *, max_sandboxes: int = 8, warm: int = 0, manager: Any = None
    ) -> AsyncIterator[Any]:
        """Sandboxes serve only the judging: as many as the host's CPUs can keep busy."""
        spec = self.sandbox_spec
        if manager is None and spec is not None:
            max_sandboxes = max(1, min(max_sandboxes, math.ceil(host_cpus() / spec.cpu)))
            warm = min(warm, max_sandboxes)
        async with super().sandbox_session(provider, max_sandboxes=max_sandboxes, warm=warm, manager=manager) as mgr:
            yield mgr

    async def judged(self, completion: list[Message], state: State) -> float:
        p = self.problems[state.info["problem_id"]]
        code = self.parser.parse_answer(completion)
        for v in VERDICTS:
            state.metrics[f"verdict_{v}"] = 0.0
        if not code:
            state.info.update(verdict="no code", passed=0, total=len(p.tests))
            state.metrics["tests_passed_fraction"] = 0.0
            return 0.0
        mgr = self.require_sandboxes()
        assert self.sandbox_spec is not None
        async with mgr.sandbox(self.sandbox_spec, reuse=True) as sb:
            result = await judge(sb, code, p, **self.judge_options)
        state.info.update(verdict=result.verdict, passed=result.passed, total=result.total)
        if result.verdict == "JE":
            raise RuntimeError(f"the judge failed on {p.id}: {result.tests[0].detail if result.tests else ''}")
        state.metrics[f"verdict_{result.verdict}"] = 1.0
        state.metrics["tests_passed_fraction"] = result.fraction
        return result.fraction if self.partial else (1.0 if result.accepted else 0.0)


def load_environment(
    source: str = "builtin",
    format: str | None = None,
    name: str | None = None,
    split: str = "test",
    limit: int | None = None,
    reward: str = "all",
    stop_on_first_failure: bool | None = None,
    include_generated: bool = True,
    time_limit_s: float | None = None,
    memory_mb: int | None = None,
    compare: str | None = None,
    sandbox_spec: SandboxSpec | None = None,
    **kwargs: Any,
) -> CodeJudgeEnv:
    if reward not in ("all", "partial"):
        raise ValueError(f"reward must be 'all' or 'partial', got {reward!r}")
    if source == "builtin":
        probs = builtin_problems()
    else:
        probs = load_problems(source, format=format, name=name, split=split, limit=limit, include_generated=include_generated)
    if limit is not None:
        probs = probs[:limit]
    if not probs:
        raise ValueError(f"no problems with tests in {source!r}")
    seen: set[str] = set()
    for i, p in enumerate(probs):  # ids key the problems: make them unique
        if p.id in seen:
            probs[i] = p = p.model_copy(update={"id": f"{p.id}#{i}"})
        seen.add(p.id)
    overrides = {k: v for k, v in {"time_limit_s": time_limit_s, "memory_mb": memory_mb, "compare": compare}.items() if v is not None}
    if overrides:
        probs = [p.model_copy(update=overrides) for p in probs]
    rows = [
        {"example_id": i, "question": prompt_of(p), "answer": p.solutions[0] if p.solutions else "", "info": {"problem_id": p.id}}
        for i, p in enumerate(probs)
    ]
    if stop_on_first_failure is None:
        stop_on_first_failure = reward == "all"  # partial credit needs every test run
    biggest = max(p.memory_mb for p in probs)
    spec = sandbox_spec or SandboxSpec(cpu=1.0, memory_mb=max(1024, biggest + 512), disk_mb=64, pids=256, exec_timeout_s=600)
    parser = CodeBlockParser("python")
    rubric = Rubric(parser=parser)
    env = CodeJudgeEnv(
        eval_dataset=rows,
        dataset=rows,  # training draws from the same problems
        parser=parser,
        rubric=rubric,
        sandbox_spec=spec,
        problems={p.id: p for p in probs},
        judge_options={"stop_on_first_failure": stop_on_first_failure},
        partial=reward == "partial",
        name="code_judge",
        **kwargs,
    )
    rubric.add_reward_func(env.judged, 1.0)
    return env
