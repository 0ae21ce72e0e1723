"""`sandgym eval ... --ray ADDRESS` on the simulated 3-node cluster: HumanEval's oracle spread
over the nodes scores 164/164; a node killed mid-run still ends with 164 records of reward
1.0, its lost rollouts reported as infrastructure failures and retried elsewhere, and no
container left behind once it is back; `--resume` works as on one machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from .conftest import node_containers

ROOT = Path(__file__).resolve().parents[2]


def eval_argv(address: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "oracle", "--ray", address,
            "-o", str(out), "--json", *extra]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def records(out: Path) -> list[dict[str, Any]]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


async def no_containers_left(cluster: Any) -> None:
    """Every node's agent is up (an agent starting on a node prunes what its dead
    predecessor left) and the fleet's sessions are closed: nothing may remain."""
    from sandgym.sandboxes.providers.ray import Fleet

    async with Fleet(cluster.address) as fleet:
        assert len(fleet.ready_nodes()) == len(cluster.running)
    with anyio.fail_after(60):  # sandboxes released in the background finish going
        while node_containers(cluster.names):
            await anyio.sleep(0.2)


def test_cli_eval_spreads_humaneval_over_the_nodes(cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(eval_argv(cluster.address, out), env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (summary["num_rollouts"], summary["passed"], summary["errors"]) == (164, 164, 0)
    assert summary["reward_mean"] == 1.0
    fleet = summary["fleet"]
    assert set(fleet["rollouts_by_node"]) == set(cluster.names)  # every node took a share
    assert fleet["concurrency"] == sum(2 * 3 for _ in cluster.names)  # 2 per sandbox slot of each node
    recs = records(out)
    assert len(recs) == 164 and len({(r["example_id"], r["rollout_index"]) for r in recs}) == 164
    assert all(r["info"]["fleet"]["retries"] == 0 for r in recs)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["ray"]["address"] == cluster.address
    anyio.run(no_containers_left, cluster)


def test_cli_eval_survives_a_node_killed_mid_run(cluster: Any, tmp_path: Path) -> None:
    victim = cluster.names[1]
    out = tmp_path / "run"
    proc = subprocess.Popen(eval_argv(cluster.address, out), env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while sum(1 for r in records(out) if r["info"]["fleet"]["node"] == victim) < 3:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the victim node never produced records"
            time.sleep(0.05)
        done_before = len(records(out))
        cluster.kill_node(victim)
        killed_at = time.time()
        left_behind = node_containers([victim])
        cluster.add_node(victim)  # the machine comes back
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert done_before < 164, "the run ended before the node was killed"
    summary = json.loads(stdout.strip().splitlines()[-1])
    recs = records(out)
    assert len(recs) == 164 and len({(r["example_id"], r["rollout_index"]) for r in recs}) == 164
    assert all(r["reward"] == 1.0 and not r["error"] for r in recs)
    assert (summary["passed"], summary["errors"], summary["reward_mean"]) == (164, 0, 1.0)
    fleet = summary["fleet"]
    assert [e["node"] for e in fleet["events"] if e["event"] == "lost"] == [victim]
    retried = [r for r in recs if r["info"]["fleet"]["retries"]]
    assert retried and fleet["retried_rollouts"] == len(retried)
    for r in retried:  # each lost attempt: on the dead node, a typed infrastructure error
        (attempt,) = r["info"]["fleet"]["attempts"]
        assert attempt["node"] == victim and attempt["error_kind"] == "sandbox"
        assert "SandboxLostError" in attempt["error"] and attempt["at"] >= killed_at - 1
        assert r["info"]["fleet"]["finished_at"] >= attempt["at"]  # the retry finished after the loss
    assert left_behind, "the killed node left no container (nothing to prune was tested)"
    anyio.run(no_containers_left, cluster)


@pytest.mark.anyio
async def test_resume_on_the_fleet_runs_only_what_is_missing(cluster: Any, tmp_path: Path) -> None:
    from sandgym.envs import load_environment
    from sandgym.fleet.driver import run_fleet_eval
    from sandgym.fleet.jobs import ClientSpec, EnvSpec

    env_spec = EnvSpec(name="humaneval")
    client = ClientSpec(model="oracle", policy="oracle")
    env = load_environment("humaneval")
    first = await run_fleet_eval(env, env_spec, client, address=cluster.address, output_dir=tmp_path, num_examples=10)
    assert (first["num_rollouts"], first["passed"], first["new_rollouts"]) == (10, 10, 10)
    second = await run_fleet_eval(env, env_spec, client, address=cluster.address, output_dir=tmp_path,
                                        num_examples=25, concurrency=4)
    assert (second["num_rollouts"], second["passed"], second["new_rollouts"], second["resumed_rollouts"]) == (25, 25, 15, 10)
    assert second["fleet"]["concurrency"] == 4 and second["fleet"]["per_node_concurrency"] == 2
    recs = records(tmp_path)
    assert len(recs) == 25 and len({r["example_id"] for r in recs}) == 25


@pytest.mark.anyio
@pytest.mark.timeout(1800)  # sandgym/math is built first when missing: minutes
async def test_an_environment_with_a_session_verifier_runs_on_the_fleet(cluster: Any, tmp_path: Path) -> None:
    """math_python opens a verifier sandbox in its sandbox session: on the fleet each node
    holds the environment inside its session, so the verifier is there for its rollouts."""
    from sandgym.envs import load_environment
    from sandgym.envs.math_python import MATH_IMAGE
    from sandgym.fleet.driver import run_fleet_eval
    from sandgym.fleet.jobs import ClientSpec, EnvSpec
    from sandgym.sandboxes.providers.docker.images import build_missing

    # Built here when missing (what a sandbox's first use does), so every node finds it.
    assert build_missing(MATH_IMAGE)
    args = {"generators": "gcd", "eval_size": 3, "train_size": 0}
    env = load_environment("math_python", **args)
    n = len(env.rows())
    node = cluster.names[2]  # one node: one verifier to start
    s = await run_fleet_eval(env, EnvSpec(name="math_python", args=args), ClientSpec(model="oracle", policy="oracle"),
                                   address=cluster.address, output_dir=tmp_path, concurrency=3, fleet_options={"nodes": [node]})
    assert (s["num_rollouts"], s["passed"], s["errors"]) == (n, n, 0), s["error_kinds"]
    assert s["fleet"]["rollouts_by_node"] == {node: n}
    # The run's session ended: the node let go of the environment and its verifier sandbox.
    from sandgym.sandboxes.providers.ray import Fleet

    async with Fleet(cluster.address, nodes=[node]) as fleet:
        (fn,) = fleet.ready_nodes()
        with anyio.fail_after(60):
            while (await fleet.call(fn, "info"))["live"]:
                await anyio.sleep(0.2)
    assert s["metrics"]["tool_calls"] >= 1  # the oracle used the Python tool on the node


def test_a_fan_in_past_what_an_agent_serves_is_refused() -> None:
    """No silent cap: more rollouts per node than an agent's max_concurrency is an error."""
    from sandgym.envs import load_environment
    from sandgym.fleet.driver import RolloutDispatcher
    from sandgym.fleet.jobs import ClientSpec, EnvSpec
    from sandgym.sandboxes.providers.ray.fleet import AGENT_MAX_CONCURRENCY, Fleet

    fleet = Fleet("127.0.0.1:1")  # never started: the check comes first
    env = load_environment("humaneval", num_examples=1)
    with pytest.raises(ValueError, match="more than a node agent serves at once"):
        RolloutDispatcher(fleet, env, EnvSpec(name="humaneval"), ClientSpec(policy="oracle"),
                          total=AGENT_MAX_CONCURRENCY, per_node=AGENT_MAX_CONCURRENCY)
    RolloutDispatcher(fleet, env, EnvSpec(name="humaneval"), ClientSpec(policy="oracle"), total=64, per_node=64)
