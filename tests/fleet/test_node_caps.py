"""A node's cap and its scoring: the cap defaults to what the node's cores can score, and
scoring on a node whose manager allows more (a larger `sandgym_sandboxes`, shared by every
driver) still runs no more test programs at once than the cores; a node warms at most that
many sandboxes; a cluster runs with Ray's token authentication, and a driver without the
token is refused, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandgym.sandboxes.cpu_bound import cpu_slots
from sandgym.sandboxes.providers.ray.cluster import LocalCluster, default_node_cap, shared_node_cap
from sandgym.sandboxes.spec import SandboxSpec, host_cpus
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]


def test_default_cap_is_what_the_cores_score() -> None:
    assert default_node_cap() == cpu_slots(SandboxSpec(cpu=0.5)) == 2 * host_cpus()
    assert shared_node_cap(1) == default_node_cap()
    assert shared_node_cap(3) == max(1, default_node_cap() // 3)
    assert shared_node_cap(10 * default_node_cap()) == 1
    # Simulated nodes share this machine's cores unless told otherwise.
    assert LocalCluster(["x0", "x1"]).max_sandboxes_per_node == shared_node_cap(2)
    assert LocalCluster(["x0"], max_sandboxes_per_node=7).max_sandboxes_per_node == 7


@pytest.mark.anyio
@pytest.mark.docker
async def test_scoring_on_a_larger_shared_cap_runs_no_more_than_the_cores() -> None:
    """What a node agent does: the environment gets the node's manager (cap three times the
    cores' slots here); its scoring still holds at most `cpu_slots` sandboxes at once, and
    every correct solution passes."""
    from sandgym import envs
    from sandgym.core.policies import get_policy
    from sandgym.sandboxes.manager import SandboxManager

    env = envs.load_environment("humaneval")
    assert env.sandbox_spec is not None
    slots = cpu_slots(env.sandbox_spec)
    in_use = peak = 0

    def handed_out(sb: Any) -> None:
        nonlocal in_use, peak
        in_use += 1
        peak = max(peak, in_use)

    def given_back(sb: Any) -> None:
        nonlocal in_use
        in_use -= 1

    policy = get_policy("oracle", env)
    rows = env.rows(3 * slots)
    async with SandboxManager("docker", max_sandboxes=3 * slots, hooks={"on_ready": handed_out, "on_release": given_back}) as mgr:
        async with env.sandbox_session(manager=mgr):
            rewards: list[float] = []

            async def one(row: Any) -> None:
                state = await env.rollout(policy, "oracle", row)
                rewards.append(state.reward)

            async with anyio.create_task_group() as tg:
                for row in rows:
                    tg.start_soon(one, row)
    assert rewards == [1.0] * len(rows)
    assert 1 <= peak <= slots, (peak, slots)


@pytest.mark.anyio
async def test_a_node_warms_no_more_than_its_cores_run(cluster: Any) -> None:
    """`prepare` on a node whose cap is three times its cpu slots asks for a warm pool of the
    whole cap; the node keeps only its cpu slots ready."""
    from sandgym.fleet import rollouts
    from sandgym.fleet.jobs import EnvSpec
    from sandgym.sandboxes.providers.ray import Fleet
    from sandgym.sandboxes.providers.ray.cluster import stop_agents

    require("docker")
    env_spec = EnvSpec(name="humaneval", args={"num_examples": 4})
    spec = env_spec.load().sandbox_spec
    assert spec is not None
    slots = cpu_slots(spec)
    wide = f"t{os.getpid()}wide"
    cluster.add_node(wide, max_sandboxes=3 * slots)
    try:
        async with Fleet(cluster.address, nodes=[wide]) as fleet:
            node = fleet.nodes[wide]
            assert node.cap == 3 * slots
            await fleet.call(node, "run", fleet.session, rollouts.prepare, env_spec, node.cap)
            assert (await fleet.call(node, "info"))["warm_pools"] == {spec.key(): slots}
            with anyio.fail_after(120):  # and that many are made
                while (info := await fleet.call(node, "info"))["idle"] < slots:
                    await anyio.sleep(0.2)
            assert info["live"] <= slots, info
    finally:
        await anyio.to_thread.run_sync(stop_agents, [wide])
        cluster.remove_node(wide)


def test_a_driver_without_the_token_is_refused(cluster: Any, tmp_path: Path) -> None:
    """The test cluster runs with token authentication: a driver with no token (an empty
    HOME, no RAY_AUTH_TOKEN) cannot join, and is told why."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    code = f"from sandgym.sandboxes.providers.ray.cluster import connect; connect({cluster.address!r}); print('joined')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode != 0 and "joined" not in r.stdout, r.stdout
    assert "needs its token" in r.stderr and "RAY_AUTH_MODE=disabled" in r.stderr, r.stderr[-2000:]
