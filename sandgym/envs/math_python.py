"""math_python: math problems with a Python tool; answers in \\boxed{}, checked by math-verify.

Problems come from reasoning-gym's procedural generators (offline, seeded, any size):
`generators` (default basic_arithmetic, gcd, simple_equations; any generator whose answers
are mathematical values works -- lcm, chain_sum, products, count_primes, gsm_symbolic and
prime_factorization were checked too), `eval_size` / `train_size` problems per generator,
`seed` (training rows use another seed than evaluation rows, so training sees fresh problems;
raise train_size or change the seed for more).

The model may call `python` (a persistent interpreter in its sandgym/math sandbox, with sympy
and numpy) as often as it likes, then answers without a tool call; the last \\boxed{...} of
that answer is compared with the generator's answer by math-verify (the answer parsed as
LaTeX only: nothing of the model's text goes through sympy's eval-based parser). math-verify
runs in a sandbox too: one verifier process per session, imported once.

The oracle first prints the answer with the python tool, then boxes it; the null policy
answers without a box.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sandgym.core.failures import ScoringTimeout
from sandgym.core.marked import marked_json
from sandgym.core.parsers import BoxedParser
from sandgym.core.python_env import PythonEnv
from sandgym.core.rubric import Rubric
from sandgym.core.sandbox_repl import ReplReply, ReplService, session_service
from sandgym.core.state import Message, State
from sandgym.core.tools import tool_call
from sandgym.sandboxes.spec import SandboxSpec

MATH_IMAGE = "sandgym/math:latest"
DEFAULT_GENERATORS = ("basic_arithmetic", "gcd", "simple_equations")
MARK = "@@sandgym-math@@ "
SYSTEM_PROMPT = (
    "Solve the problem. You can run Python with the `python` tool (a persistent interpreter with "
    "sympy and numpy) to compute or check your work. When done, reply without a tool call and put "
    "the final answer in \\boxed{}."
)

VERIFIER_SETUP = """
import json as _sg_json
from importlib.metadata import version as _sg_version
from math_verify import parse as _mv_parse, verify as _mv_verify
from math_verify import LatexExtractionConfig as _MvLatex, ExprExtractionConfig as _MvExpr

def _sg_check(gold, boxed):
    g = _mv_parse(gold, extraction_config=[_MvLatex(), _MvExpr()], parsing_timeout=5)
    if not g:
        g = _mv_parse("$" + gold + "$", extraction_config=[_MvLatex(), _MvExpr()], parsing_timeout=5)
    # The model's answer: LaTeX only (no expression parser, which would eval its text).
    p = _mv_parse("\\\\boxed{" + boxed + "}", extraction_config=[_MvLatex()], parsing_timeout=5)
    ok = bool(g) and bool(p) and bool(_mv_verify(g, p, timeout_seconds=5))
    print(__MARK__ + _sg_json.dumps({"ok": ok, "gold": [str(x) for x in g[:1]], "pred": [str(x) for x in p[:1]]}))

print(__MARK__ + _sg_json.dumps({"math_verify": _sg_version("math-verify")}))
""".replace("__MARK__", repr(MARK))


def _check_setup(reply: ReplReply) -> None:
    if not reply.ok or marked_json(reply.stdout, MARK) is None:
        raise RuntimeError(f"the math-verify checker did not start ({reply.status}): {reply.stderr[-1500:]}")


def make_rows(generators: list[str], size: int, seed: int) -> list[dict[str, Any]]:
    """`size` problems of each generator, interleaved (reasoning-gym, offline and seeded)."""
    import reasoning_gym

    per_gen = [reasoning_gym.create_dataset(g, size=size, seed=seed) for g in generators]
    rows: list[dict[str, Any]] = []
    for i in range(size):
        for g, ds in zip(generators, per_gen, strict=True):
            e = ds[i]
            rows.append(
                {
                    "example_id": len(rows),
                    "question": e["question"],
                    "answer": str(e["answer"]),
                    "info": {"generator": g, "index": i, "seed": seed},
                }
            )
    return rows


class MathPythonEnv(PythonEnv):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.verifier: ReplService | None = None

    @asynccontextmanager
    async def sandbox_session(
        self, provider: Any = "docker", *, max_sandboxes: int = 8, warm: int = 0, manager: Any = None
    ) -> AsyncIterator[Any]:
        """The rollouts' sandboxes, plus one for the session's verifier (taken first, so busy
        rollouts can never leave scoring without one)."""
        if manager is None:
            max_sandboxes += 1
        async with super().sandbox_session(provider, max_sandboxes=max_sandboxes, warm=warm, manager=manager) as mgr:
            verifier = session_service(
                lambda tg: ReplService(
                    mgr, self.sandbox_spec, tg, setup_code=VERIFIER_SETUP, setup_timeout=300.0,
                    check_setup=_check_setup, name="mathverify",
                )
            )  # fmt: skip
            async with verifier as self.verifier:
                try:
                    yield mgr
                finally:
                    self.verifier = None

    async def correct(self, completion: list[Message], answer: str, state: State) -> float:
        boxed = self.parser.parse_answer(completion)
        state.metrics["has_boxed"] = 1.0 if boxed else 0.0
        if not boxed:
            return 0.0
        if self.verifier is None:
            raise RuntimeError("math_python checks answers in a sandbox: run it inside `env.sandbox_session(...)`")
        code = f"_sg_check(_sg_json.loads({json.dumps(answer)!r}), _sg_json.loads({json.dumps(boxed)!r}))\n"
        reply = await self.verifier.run(code, timeout=60.0)
        if reply.status == "timeout":
            # math-verify's own limits (5 s) give up inside the cell: a cell past 60 s was starved.
            raise ScoringTimeout("math-verify did not answer in 60s: the machine was too loaded to check")
        out = marked_json(reply.stdout, MARK) if reply.ok else None
        if out is None:
            # math-verify gave up (a timeout or a crash on this answer): not a correct answer.
            state.info["verify_error"] = (reply.stderr or reply.status)[-500:]
            return 0.0
        return 1.0 if out["ok"] else 0.0

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        answer = str(state.answer).strip().strip("$")
        if not any(m.get("role") == "tool" for m in messages):
            return {
                "role": "assistant",
                "content": "Let me check with Python.",
                "tool_calls": [tool_call("python", {"code": f"print({answer!r})"}, f"call_{state.id[:8]}_0")],
            }
        return {"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}."}


def load_environment(
    generators: str | list[str] | tuple[str, ...] = DEFAULT_GENERATORS,
    eval_size: int = 50,
    train_size: int = 1000,
    seed: int = 0,
    max_turns: int = 8,
    sandbox_spec: SandboxSpec | None = None,
    **kwargs: Any,
) -> MathPythonEnv:
    gens = [g.strip() for g in generators.split(",")] if isinstance(generators, str) else list(generators)
    if not gens:
        raise ValueError("give at least one reasoning-gym generator")
    eval_rows = make_rows(gens, eval_size, seed + 1_000_003)
    train_rows = make_rows(gens, train_size, seed) if train_size > 0 else None
    spec = sandbox_spec or SandboxSpec(image=MATH_IMAGE, cpu=1.0, memory_mb=1024, disk_mb=64, exec_timeout_s=120)
    parser = BoxedParser()

    def tool_calls(state: State) -> float:
        return float(sum(len(t.completion.get("tool_calls") or []) for t in state.turns))

    rubric = Rubric(parser=parser)
    env = MathPythonEnv(
        dataset=train_rows,
        eval_dataset=eval_rows,
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
        sandbox_spec=spec,
        max_turns=max_turns,
        name="math_python",
        **kwargs,
    )
    rubric.add_reward_func(env.correct, 1.0)
    rubric.add_metric(tool_calls)
    return env
