"""HumanEval's single-turn scoring fast paths against the real Docker engine: sandboxes
reused between rollouts (reset in between, so nothing of one rollout reaches the next),
the pool sized by what scoring can use, and batch scoring (one exec_many per sandbox)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from sandgym import envs
from sandgym.core.evaluation import run_eval
from sandgym.core.policies import get_policy
from sandgym.envs.humaneval import run_tests, scoring_pool_size
from sandgym.sandboxes import SandboxManager, SandboxSpec
from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.providers.docker import DockerProvider
from sandgym.sandboxes.spec import host_cpus
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

SPEC = SandboxSpec(cpu=0.5, memory_mb=512, disk_mb=64, ttl_s=600)
INFO = {"prompt": "def f():\n", "entry_point": "f", "test": "def check(f):\n    assert f()\n"}

# Leaves a file, a background process that left the process group, and a daemon.
DIRTY = (
    "import subprocess\n"
    "open('/tmp/leak', 'w').write('x')\n"
    "open('/workspace/leak', 'w').write('x')\n"
    "subprocess.Popen(['setsid', 'sleep', '377'])\n"
    "subprocess.Popen(['sh', '-c', 'sleep 378 &'])\n"
    "def f():\n"
    "    return True\n"
)
# Passes only in a clean sandbox.
CLEAN = (
    "import os, subprocess\n"
    "def f():\n"
    "    ps = subprocess.run(['ps', '-eo', 'args='], capture_output=True, text=True).stdout\n"
    "    return not os.path.exists('/tmp/leak') and not os.path.exists('/workspace/leak') "
    "and 'sleep 37' not in ps\n"
)


async def test_reused_sandbox_is_clean_for_the_next_rollout() -> None:
    require("docker")
    async with SandboxManager("docker", max_sandboxes=1) as mgr:
        await mgr.warm(SPEC, 1)
        assert await run_tests(DIRTY, INFO, sandboxes=mgr, spec=SPEC, reuse=True)
        assert await run_tests(CLEAN, INFO, sandboxes=mgr, spec=SPEC, reuse=True)
        assert mgr.stats["reused"] == 2 and mgr.stats["created"] == 1
        # Without reuse the (pooled) sandbox is destroyed after use: the next one is new.
        assert await run_tests(CLEAN, INFO, sandboxes=mgr, spec=SPEC)
        assert mgr.live == 0
        assert await run_tests(CLEAN, INFO, sandboxes=mgr, spec=SPEC)
        assert mgr.stats["created"] == 2


def test_scoring_pool_size_follows_concurrency_and_cpus() -> None:
    assert scoring_pool_size(1, SPEC) == 1
    assert scoring_pool_size(64, SPEC) == int(host_cpus() / 0.5)
    assert scoring_pool_size(3, SPEC.model_copy(update={"cpu": float(host_cpus())})) == 1


@pytest.mark.parametrize("batch", [False, True])
async def test_oracle_and_null_with_reuse_and_batching(batch: bool, tmp_path: Path) -> None:
    require("docker")
    env = envs.load_environment("humaneval", batch_scoring=batch)
    n = 8
    good = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o",
                          num_examples=n, concurrency=4, provider="docker")
    bad = await run_eval(env, get_policy("null", env), "null", output_dir=tmp_path / "n",
                         num_examples=n, concurrency=4, provider="docker")
    assert good["num_rollouts"] == n and good["reward_mean"] == 1.0 and good["errors"] == 0
    assert bad["num_rollouts"] == n and bad["reward_mean"] == 0.0 and bad["errors"] == 0


class CountingDocker(DockerProvider):
    """The Docker provider, counting the sandboxes it makes."""

    made = 0

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> Sandbox:
        self.made += 1
        return await super().create(spec, labels)


async def test_an_eval_longer_than_its_pool_makes_no_sandbox_after_the_pool(tmp_path: Path) -> None:
    """Rollouts outnumber sandboxes: each sandbox scores many rollouts, reset in between, and
    the end of the run makes none anew. (The pool once shrank to the rollouts not yet
    started, destroying sandboxes that started rollouts were about to score in, and made
    new containers for them.)"""
    require("docker")
    env = envs.load_environment("humaneval", num_examples=24)
    provider = CountingDocker()
    s = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "run", concurrency=8, provider=provider)
    assert s["num_rollouts"] == 24 and s["reward_mean"] == 1.0 and s["errors"] == 0, s
    assert env.sandbox_spec is not None
    assert provider.made <= scoring_pool_size(8, env.sandbox_spec), provider.made


LOOP = "def f():\n    while True:\n        pass\n"


async def test_a_loop_in_the_code_fails_at_the_cpu_limit() -> None:
    """The policy's own loop is its failure: the CPU limit ends it, a 0, no error."""
    require("docker")
    async with SandboxManager("docker", max_sandboxes=1) as mgr:
        assert await run_tests(LOOP, INFO, sandboxes=mgr, spec=SPEC, cpu_s=1) is False


async def test_a_scorer_too_slow_to_decide_is_an_infra_failure_not_a_zero(tmp_path: Path) -> None:
    """A real slow scorer: the sandbox gets 1% of a CPU, so Python cannot even start within
    the tests' 1 s wall-clock limit, although the reference solution is right. The rollout
    is an infrastructure failure (error_kind timeout, with why), out of reward_mean, never a
    0 for the policy."""
    require("docker")
    starved = SandboxSpec(cpu=0.01, memory_mb=512, disk_mb=64, ttl_s=600)
    env = envs.load_environment("humaneval", sandbox_spec=starved, test_timeout_s=1.0, reuse_sandboxes=False)
    s = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "run", num_examples=2,
                       concurrency=2, provider="docker")
    assert s["errors"] == 2 and s["error_kinds"] == {"timeout": 2} and s["reward_mean"] is None, s
    for rec in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines()):
        assert rec["error_kind"] == "timeout" and "ScoringTimeout" in rec["error"] and "too loaded to decide" in rec["error"], rec["error"]
        assert rec["metrics"]["passes_tests_error"] == 1.0
