"""HumanEval's single-turn scoring fast paths against the real Docker engine: sandboxes
reused between rollouts (reset in between, so nothing of one rollout reaches the next),
the pool sized by what scoring can use, and batch scoring (one exec_many per sandbox)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym import envs
from sandgym.envs.humaneval import run_tests, scoring_pool_size
from sandgym.core.policies import get_policy
from sandgym.core.evaluation import run_eval
from sandgym.sandboxes import SandboxManager, SandboxSpec
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
