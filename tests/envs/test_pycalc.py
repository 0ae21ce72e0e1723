"""pycalc: success needs a python tool call run in the rollout's sandbox (the numbers exist only
there) whose printed result the judge, run in that sandbox, accepts, and a final answer after
it. Local provider (no Docker needed); the learning gate runs it on docker too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from sandgym import envs
from sandgym.core.clients import ModelResponse
from sandgym.core.policies import get_policy
from sandgym.core.state import Message, State
from sandgym.core.tools import tool_call
from sandgym.envs.pycalc import QUESTIONS

pytestmark = pytest.mark.anyio


class Scripted:
    """A policy that knows the answer (the dataset's) and may or may not use the tool."""

    name = "scripted"

    def __init__(self, use_tool: bool, answer: str | None = None, code: str | None = None, calls: int = 1) -> None:
        self.use_tool, self.answer, self.code, self.calls = use_tool, answer, code, calls

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str = "",
        tools: Sequence[dict[str, Any]] | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        state: State | None = None,
    ) -> ModelResponse:
        assert state is not None
        if self.use_tool and sum(m["role"] == "tool" for m in messages) < self.calls:
            code = self.code or QUESTIONS[state.info["kind"]][1]
            return ModelResponse(message={"role": "assistant", "content": "", "tool_calls": [tool_call("python", {"code": code}, "c0")]})
        return ModelResponse(message={"role": "assistant", "content": self.answer if self.answer is not None else str(state.answer)})


async def _run(client: Any, n: int = 8) -> list[State]:
    env = envs.load_environment("pycalc", num_eval=n)
    async with env.sandbox_session("local", max_sandboxes=4):
        return await env.generate(client, "m", env.rows(n), split="eval", max_concurrent=4)


async def test_oracle_succeeds_through_the_sandbox_and_nothing_else_does() -> None:
    env = envs.load_environment("pycalc", num_eval=8)
    rows = env.rows(8)
    assert {r["info"]["kind"] for r in rows} == set(QUESTIONS)
    for r in rows:  # the numbers are never shown to the model
        assert all(str(x) not in r["question"] for x in r["info"]["n"])
    oracle = await _run(get_policy("oracle", env))
    assert [s.reward for s in oracle] == [1.0] * 8 and all(s.error is None for s in oracle)
    for s in oracle:
        assert len(s.turns) == 2 and s.turns[0].env_response[0]["content"] == s.answer  # the sandbox computed it
        assert s.metrics["tool_ran"] == 1.0 and s.metrics["answer_matches"] == 1.0
        assert s.tools and s.tools[0]["function"]["name"] == "python"
    # The right answer without running the tool: no sandbox ran anything, no reward.
    cheat = await _run(Scripted(use_tool=False))
    assert [s.reward for s in cheat] == [0.0] * 8 and all(s.sandbox_id is None for s in cheat)
    # The program printed the right value; the final answer says something else: rewarded,
    # and the mismatch is recorded.
    wrong = await _run(Scripted(use_tool=True, answer="10"))
    assert [s.reward for s in wrong] == [1.0] * 8 and all(s.metrics["answer_matches"] == 0.0 for s in wrong)
    # A program that prints something else, or fails: the judge in the sandbox says no.
    for code in ("print('x')", "print(undefined_name)"):
        bad = await _run(Scripted(use_tool=True, code=code))
        assert [s.reward for s in bad] == [0.0] * 8 and all(s.metrics["tool_ran"] == 1.0 for s in bad)
    assert "NameError" in bad[0].turns[0].env_response[0]["content"]
    # No final answer: the rollout ends on a tool result at max_turns.
    endless = await _run(Scripted(use_tool=True, calls=10))
    assert [s.reward for s in endless] == [0.0] * 8 and all(s.stop_reason == "max_turns_reached" for s in endless)
