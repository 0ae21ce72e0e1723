"""math_python in real sandgym/math sandboxes (built on first use when missing): oracle 1 and
null 0 on three reasoning-gym generators (a few problems each; SANDGYM_BENCH_FULL=1 for the
default 50), a wrong boxed answer scores 0, rows are seeded, and the training path (generate)
works."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

require("reasoning_gym")

from sandgym import envs
from sandgym.core.clients import ModelResponse
from sandgym.core.evaluation import run_eval
from sandgym.core.policies import OraclePolicy, get_policy
from tests.conftest import require

# sandgym/math is built by the first sandbox that needs it when missing (bootstrap builds only
# the core images): minutes on a loaded machine, hence the longer limit.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(1800)]

GENERATORS = ["basic_arithmetic", "gcd", "simple_equations"]
EVAL_SIZE = 50 if os.environ.get("SANDGYM_BENCH_FULL") == "1" else 4


class OffByOne:
    """Boxes the right answer plus one (a wrong answer in the right form)."""

    name = "off_by_one"

    async def chat(self, messages: Any, *, model: str = "x", tools: Any = None, sampling_args: Any = None, state: Any = None) -> ModelResponse:
        wrong = int(str(state.answer)) + 1
        return ModelResponse(message={"role": "assistant", "content": f"\\boxed{{{wrong}}}"}, finish_reason="stop")


def test_rows_are_seeded_and_training_rows_are_other_problems() -> None:
    a = envs.load_environment("math_python", eval_size=5, train_size=5)
    b = envs.load_environment("math_python", eval_size=5, train_size=5)
    assert [r["question"] for r in a.rows()] == [r["question"] for r in b.rows()]
    assert {r["info"]["generator"] for r in a.rows()} == set(GENERATORS) and len(a.rows()) == 15
    assert {r["question"] for r in a.rows()}.isdisjoint({r["question"] for r in a.rows(split="train")})
    c = envs.load_environment("math_python", eval_size=5, train_size=0, seed=1)
    assert [r["question"] for r in c.rows()] != [r["question"] for r in a.rows()]


@pytest.mark.docker
async def test_oracle_scores_1_and_null_0_on_three_generators(tmp_path: Path) -> None:
    require("docker")
    env = envs.load_environment("math_python", generators=GENERATORS, eval_size=EVAL_SIZE, train_size=0)
    good = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o", concurrency=4)
    bad = await run_eval(env, get_policy("null", env), "null", output_dir=tmp_path / "n", concurrency=4)
    assert good["num_rollouts"] == 3 * EVAL_SIZE and good["reward_mean"] == 1.0 and good["errors"] == 0
    assert good["metrics"]["tool_calls"] == 1.0  # the oracle used the python tool in its sandbox
    assert bad["reward_mean"] == 0.0 and bad["errors"] == 0 and bad["metrics"]["has_boxed"] == 0.0


@pytest.mark.docker
async def test_a_wrong_boxed_answer_scores_0(tmp_path: Path) -> None:
    require("docker")
    env = envs.load_environment("math_python", generators=["basic_arithmetic", "gcd"], eval_size=3, train_size=0)
    s = await run_eval(env, OffByOne(), "off_by_one", output_dir=tmp_path, concurrency=3)
    assert s["reward_mean"] == 0.0 and s["errors"] == 0 and s["metrics"]["has_boxed"] == 1.0


@pytest.mark.docker
@pytest.mark.parametrize("name,args", [
    ("math_python", {"eval_size": 1, "train_size": 2}),
    ("code_judge", {"limit": 2}),
    ("bfcl_v4_multi_turn", {"ids": "multi_turn_base_0,multi_turn_miss_param_0"}),
    ("bfcl_v4_single_turn", {"ids": "simple_python_0,irrelevance_0"}),
])  # fmt: skip
async def test_the_training_path_loads_by_name_and_scores_groups(name: str, args: dict[str, Any]) -> None:
    """What `sandgym train` does with an environment: load it by name, roll out groups of a
    training batch with `generate`, get rewards and advantages."""
    require("docker")
    if name.startswith("bfcl"):
        require("bfcl_eval")
    from sandgym.train.env_source import EnvRolloutSource

    source = EnvRolloutSource(name, args)
    env = source.env
    rows = source.rows_at(0, 2)
    async with env.sandbox_session("docker", max_sandboxes=4):
        states = await env.generate(OraclePolicy(env), "oracle", rows, rollouts_per_example=2, max_concurrent=4)
    assert len(states) == 4 and all(s.error is None for s in states), [s.error for s in states]
    assert all(s.reward == 1.0 and s.advantage is not None for s in states)
