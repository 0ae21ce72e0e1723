"""Typed rollout failures: each failure gets its kind, and summaries keep failures out of
rewards and pass@k (they are infrastructure's, not the policy's)."""

from __future__ import annotations

from typing import Any

import pytest

from sandgym.core import SingleTurnEnv
from sandgym.core.clients import ModelError
from sandgym.core.evaluation import summarize
from sandgym.core.failures import classify
from sandgym.core.policies import OraclePolicy
from sandgym.core.rubric import Rubric
from sandgym.sandboxes.errors import SandboxGoneError

pytestmark = pytest.mark.anyio


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:  # we want the object with its chain
        return caught


def test_classify_walks_the_cause_chain() -> None:
    assert classify(SandboxGoneError("gone")) == "sandbox"
    assert classify(ModelError("500 after 3 attempt(s)")) == "model"
    assert classify(TimeoutError()) == "timeout"
    assert classify(ValueError("bad row")) == "environment"
    assert classify(ValueError("x"), default="scoring") == "scoring"
    # A reward function that failed because its sandbox was lost is the sandbox's failure.
    assert classify(_raised(RuntimeError("tests could not run"), SandboxGoneError("lost"))) == "sandbox"
    assert classify(_raised(RuntimeError("wrapped"), ModelError("down"))) == "model"


def _env(reward: Any) -> SingleTurnEnv:
    rows = [{"prompt": [{"role": "user", "content": "q"}], "answer": "a"}]
    return SingleTurnEnv(dataset=rows, rubric=Rubric(funcs=[reward]))


async def test_rollout_records_the_kind_of_its_failure() -> None:
    def lost(**_: Any) -> float:
        raise SandboxGoneError("the sandbox died while scoring")

    def crashes(**_: Any) -> float:
        raise KeyError("reward bug")

    def right(completion: Any, answer: str, **_: Any) -> float:
        return 1.0

    for func, kind in ((lost, "sandbox"), (crashes, "scoring"), (right, None)):
        env = _env(func)
        state = await env.rollout(OraclePolicy(env), "oracle", env.rows()[0])
        assert state.error_kind == kind, (func.__name__, state.error, state.error_kind)
        assert state.failed is (kind is not None)
        assert state.reward == (0.0 if kind else 1.0)


def test_summary_keeps_failures_out_of_rewards_and_pass_at_k() -> None:
    recs = [
        {"example_id": 0, "reward": 1.0},
        {"example_id": 0, "reward": 0.0, "error": "SandboxGoneError: lost", "error_kind": "sandbox"},
        {"example_id": 1, "reward": 0.0},
        {"example_id": 1, "reward": 1.0},
        {"example_id": 2, "reward": 0.0, "error": "ModelError: down", "error_kind": "model"},
        {"example_id": 2, "reward": 0.0, "error": "TimeoutError: slow"},  # untyped (old record)
    ]
    s = summarize(recs)
    assert s["num_examples"] == 3 and s["num_rollouts"] == 6
    assert s["errors"] == 3 and s["infra_failure_rate"] == 0.5
    assert s["error_kinds"] == {"sandbox": 1, "model": 1, "TimeoutError": 1}
    assert s["reward_mean"] == pytest.approx(2 / 3)  # valid rollouts only
    assert s["reward_mean_with_failures"] == pytest.approx(2 / 6)
    # pass@1 over examples with valid attempts: example 0 (1 valid, passed), 1 (1 of 2).
    assert s["pass_at_k_examples"] == 2
    assert s["pass_at_k"] == {"1": pytest.approx((1.0 + 0.5) / 2)}
    assert s["passed"] == 2
