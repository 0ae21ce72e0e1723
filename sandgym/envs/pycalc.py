"""pycalc: arithmetic over numbers that only the sandbox holds, answered by running Python.

The smallest task where success needs sandboxed tool use over several turns, small enough for
a tiny random model to learn on CPU (the learning demonstration: examples/pycalc_*.toml):

    user       What is the last digit of the sum of n?
    assistant  <tool_call>{"name": "python", "arguments": {"code": "print(sum(n)%10)"}}</tool_call>
    tool       7
    assistant  7

Each task's numbers (`n`: five to nine integers from 10 to 999) are written into the rollout's
own sandbox and never shown to the model: no policy can answer without running code there.
The `python` tool runs `python3 -` on CODE in that sandbox with `n` defined. Questions ask for
one digit (the last digit of the sum, the largest or the smallest number, or how many numbers
there are).

Reward 1 when the exchange is complete and right: a python tool call ran in the sandbox, what
it printed there (the last tool result) is the task's answer -- the rubric recomputes it from the
task's own data file, in the rollout's sandbox -- and the model then closed with a final answer
(an assistant message without a tool call). Whether the final answer repeats the number is
recorded as the `answer_matches` metric, not rewarded: carrying a digit from the tool result
into the reply takes a copy circuit the tiny CPU models of the learning demonstration do not
form within its budget, so the reward judges the computation and the protocol, not the copy.

Rows are split once, by seed: `num_eval` held-out tasks for `sandgym eval` and the rest for
training. The four question texts are shared by both splits; the numbers behind them are not.
`split = "train"` makes `sandgym eval` run the training tasks instead (to record
demonstrations for `sandgym sft` without touching the held-out ones).

The oracle calls the tool with the question's program and answers with what the sandbox
printed. With `oracle_accuracy` below 1 it is a tool user that knows the protocol but not
always which computation a question asks for: it runs the question's program with that
probability and one of the three others otherwise (drawn per task and rollout), and answers
with what the program printed. Its unfiltered records are the warm start of the learning
demonstration: SFT on them teaches the protocol and the tool call, and the choice of program
only as well as the demonstrator made it; the reward, scored in the sandbox, has to teach the rest.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from sandgym.core.failures import ScoringTimeout
from sandgym.core.parsers import last_assistant_text
from sandgym.core.rubric import Rubric
from sandgym.core.sandbox_env import SandboxEnv, checked, format_exec
from sandgym.core.state import Message, State
from sandgym.core.tools import tool_call
from sandgym.sandboxes.spec import SandboxSpec

# kind -> (question, the program that answers it with `n` defined)
QUESTIONS: dict[str, tuple[str, str]] = {
    "sum": ("What is the last digit of the sum of n?", "print(sum(n)%10)"),
    "max": ("What is the last digit of the largest number in n?", "print(max(n)%10)"),
    "min": ("What is the last digit of the smallest number in n?", "print(min(n)%10)"),
    "len": ("How many numbers are in n?", "print(len(n))"),
}
DATA_FILE = "pycalc_data.py"

# Run in the sandbox by the judge on the task's data file, after `kind` (the question's) and
# `got` (what the program printed and the final answer) are defined. Prints two bits:
# printed-is-right, answer-is-right.
JUDGE = (
    "from pycalc_data import n\n"
    "want = str({'sum': sum(n) % 10, 'max': max(n) % 10, 'min': min(n) % 10, 'len': len(n)}[kind])\n"
    "print(int(got['printed'].strip() == want), int(got['answer'].strip() == want))\n"
)


def make_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    kinds = list(QUESTIONS)
    rows = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        n = [rng.randint(10, 999) for _ in range(rng.randint(5, 9))]
        answer = {"sum": sum(n) % 10, "max": max(n) % 10, "min": min(n) % 10, "len": len(n)}[kind]
        rows.append({"question": QUESTIONS[kind][0], "answer": str(answer), "info": {"kind": kind, "n": n}})
    return rows


class PyCalcEnv(SandboxEnv):
    def __init__(self, *args: Any, oracle_accuracy: float = 1.0, **kwargs: Any) -> None:
        if not 0.0 <= oracle_accuracy <= 1.0:
            raise ValueError(f"oracle_accuracy must be between 0 and 1, got {oracle_accuracy!r}")
        super().__init__(*args, **kwargs)
        self.oracle_accuracy = oracle_accuracy
        # Only `python` (a stateless `python3 -` per call): no bash tool.
        self.tools.pop("bash", None)
        self.skipped_args.pop("bash", None)
        self.tool_schemas = []
        self.add_tool(self.python, args_to_skip=["sandbox"])

    async def setup_sandbox(self, sandbox: Any, state: State) -> None:
        await sandbox.write_file(DATA_FILE, f"n = {list(state.info['n'])!r}\n")

    async def python(self, code: str, sandbox: Any) -> str:
        """Run Python code with the list `n` defined; returns what it prints.

        Args:
            code: Python source.
        """
        program = f"from pycalc_data import n\n{code}"
        # exec_python: docker's execd forks it from a warm interpreter (no interpreter start
        # per call: most of a rollout's sandbox CPU).
        result = await checked(sandbox, sandbox.exec_python(program, timeout=self.command_timeout_s))
        return format_exec(result, timeout=self.command_timeout_s)

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return {"role": "assistant", "content": str(last.get("content") or "").strip()}
        kind = state.info["kind"]
        rng = random.Random(f"{state.example_id}/{state.rollout_index}")
        if rng.random() >= self.oracle_accuracy:
            kind = rng.choice([k for k in QUESTIONS if k != kind])
        code = QUESTIONS[kind][1]
        return {"role": "assistant", "content": "", "tool_calls": [tool_call("python", {"code": code}, "call_0")]}


async def judge(completion: list[Message], state: State, sandbox: Any) -> tuple[float, float]:
    """(solved, answer_matches), judged in the rollout's sandbox; (0, 0) when no tool call
    ran there or the exchange did not end with a final answer. Cached on the state (the
    reward and the metric share one judge run)."""
    if "pycalc_judge" in state.scratch:
        return state.scratch["pycalc_judge"]
    out = (0.0, 0.0)
    final = completion[-1] if completion else {}
    results = [m for m in completion if m.get("role") == "tool"]
    closed = final.get("role") == "assistant" and not final.get("tool_calls") and last_assistant_text([final]).strip()
    if sandbox is not None and results and closed:
        got = {"printed": str(results[-1].get("content") or ""), "answer": last_assistant_text([final])}
        # The model's text enters the program as literals (repr), never as code.
        r = await checked(sandbox, sandbox.exec_python(f"kind = {state.info['kind']!r}\ngot = {got!r}\n{JUDGE}", timeout=30))
        if r.timed_out:
            raise ScoringTimeout("pycalc's judge did not finish in 30s: the machine was too loaded to judge")
        bits = r.stdout.split()
        if r.exit_code != 0 or len(bits) != 2:
            raise RuntimeError(f"pycalc judge failed (exit {r.exit_code}): {r.stderr[-300:]}")
        out = (float(bits[0]), float(bits[1]))
    state.scratch["pycalc_judge"] = out
    return out


async def solved(completion: list[Message], state: State, sandbox: Any) -> float:
    return (await judge(completion, state, sandbox))[0]


async def answer_matches(completion: list[Message], state: State, sandbox: Any) -> float:
    return (await judge(completion, state, sandbox))[1]


def tool_ran(state: State) -> float:
    return 1.0 if state.sandbox_id is not None else 0.0


def load_environment(
    num_eval: int = 64,
    num_train: int = 2048,
    seed: int = 0,
    split: Literal["eval", "train"] = "eval",
    max_turns: int = 3,
    command_timeout_s: float = 10.0,
    sandbox_spec: SandboxSpec | None = None,
    oracle_accuracy: float = 1.0,
    **kwargs: Any,
) -> PyCalcEnv:
    if split not in ("eval", "train"):
        raise ValueError(f"split must be 'eval' or 'train', got {split!r}")
    rows = make_rows(num_eval + num_train, seed)
    held_out, train = rows[:num_eval], rows[num_eval:]
    rubric = Rubric(funcs=[solved])
    rubric.add_metric(answer_matches)
    rubric.add_metric(tool_ran)
    return PyCalcEnv(
        dataset=train,
        eval_dataset=held_out if split == "eval" else train,
        rubric=rubric,
        max_turns=max_turns,
        command_timeout_s=command_timeout_s,
        sandbox_spec=sandbox_spec or SandboxSpec(cpu=0.5, memory_mb=256, disk_mb=16, pids=64, exec_timeout_s=30),
        reuse_sandboxes=True,
        name="pycalc",
        oracle_accuracy=oracle_accuracy,
        **kwargs,
    )
