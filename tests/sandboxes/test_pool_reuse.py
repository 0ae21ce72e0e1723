"""Warm-pool reuse (reset between users), background recycling and exec_many through the
manager, against the real Docker engine (execd transport) and the real local provider."""

from __future__ import annotations

import anyio
import pytest

from sandgym.sandboxes import SandboxManager, SandboxSpec, get_provider
from sandgym.sandboxes.base import ExecJob
from sandgym.sandboxes.spec import LABEL_OWNER
from tests.conftest import require

pytestmark = pytest.mark.anyio

SPEC = SandboxSpec(memory_mb=256, disk_mb=64, ttl_s=600)


async def _ids_of_run(provider_name: str, run_id: str) -> set[str]:
    p = get_provider(provider_name)
    try:
        return {i.id for i in await p.list({LABEL_OWNER: run_id})}
    finally:
        await p.aclose()


@pytest.mark.docker
async def test_reuse_resets_and_pools_the_same_sandbox() -> None:
    require("docker")
    async with SandboxManager("docker", max_sandboxes=1) as mgr:  # no refill: one box
        await mgr.warm(SPEC, 1)
        async with mgr.sandbox(SPEC, reuse=True) as sb:
            first = sb.id
            await sb.exec("echo secret > /workspace/s; echo t > /tmp/t; setsid sleep 311 & sleep 312 &")
        assert mgr.stats["reused"] == 1
        async with mgr.sandbox(SPEC, reuse=True) as sb:
            assert sb.id == first  # the same container, made like new
            r = await sb.exec("ls -A /workspace /tmp; ps -eo args= | grep -c '[s]leep 31' || true")
            assert r.stdout.split() == ["/tmp:", "/workspace:", "0"], r.stdout
        # An error inside the block: never pooled, destroyed.
        with pytest.raises(RuntimeError):
            async with mgr.sandbox(SPEC, reuse=True) as sb:
                broken = sb.id
                raise RuntimeError("rollout failed")
        for _ in range(200):
            if broken not in await _ids_of_run("docker", mgr.run_id):
                break
            await anyio.sleep(0.05)
        assert broken not in await _ids_of_run("docker", mgr.run_id)
        run = mgr.run_id
    assert await _ids_of_run("docker", run) == set()


async def test_reuse_without_reset_support_destroys_in_background() -> None:
    # The local provider cannot reset: reuse falls back to destroying, off the caller's path.
    async with SandboxManager("local", max_sandboxes=2) as mgr:
        await mgr.warm(SPEC, 1)
        async with mgr.sandbox(SPEC, reuse=True) as sb:
            first = sb.id
            assert await sb.reset() is False
        assert mgr.stats["reused"] == 0
        for _ in range(200):
            if first not in await _ids_of_run("local", mgr.run_id):
                break
            await anyio.sleep(0.05)
        assert first not in await _ids_of_run("local", mgr.run_id)
        async with mgr.sandbox(SPEC) as sb:
            assert sb.id != first
        run = mgr.run_id
    assert await _ids_of_run("local", run) == set()


async def test_background_recycle_frees_the_slot_and_close_waits() -> None:
    async with SandboxManager("local", max_sandboxes=1, background_recycle=True) as mgr:
        async with mgr.sandbox(SPEC) as sb:
            first = sb.id
        # The slot comes back once the destroy finished, so a second one can be made.
        async with mgr.sandbox(SPEC) as sb:
            assert sb.id != first and mgr.live == 1
        run = mgr.run_id
    assert mgr.live == 0
    assert await _ids_of_run("local", run) == set()


@pytest.mark.parametrize("provider_name", ["docker", "local"])
async def test_exec_many_through_the_manager(provider_name: str) -> None:
    if provider_name == "docker":
        require("docker")
    seen: list[str] = []
    jobs = [ExecJob(f"echo {i}") for i in range(6)] + [ExecJob("sleep 20", timeout=1)]
    async with SandboxManager(provider_name) as mgr:
        async with mgr.sandbox(SPEC) as sb:
            results = await sb.exec_many(jobs)
            assert [r.stdout for r in results[:6]] == [f"{i}\n" for i in range(6)]
            assert results[6].timed_out and results[6].exit_code == 124
    # With exec hooks, each job goes through them.
    hooks = {"before_exec": lambda sb, cmd: seen.append(str(cmd))}
    async with SandboxManager(provider_name, hooks=hooks) as mgr:
        async with mgr.sandbox(SPEC) as sb:
            results = await sb.exec_many(jobs[:3])
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    assert sorted(seen) == ["echo 0", "echo 1", "echo 2"]


@pytest.mark.parametrize("provider_name", ["docker", "local"])
async def test_exec_batcher_gathers_concurrent_jobs(provider_name: str) -> None:
    from sandgym.sandboxes.batching import ExecBatcher

    if provider_name == "docker":
        require("docker")
    results: dict[int, str] = {}
    async with SandboxManager(provider_name, max_sandboxes=4) as mgr:
        batcher = ExecBatcher(mgr, SPEC, max_batch=5, window_s=0.2)

        async def one(i: int) -> None:
            r = await batcher.run(ExecJob(["python3", "-c", f"print({i} * 3)"]))
            results[i] = r.stdout

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        slow = await batcher.run(ExecJob("sleep 20", timeout=1))
        assert slow.timed_out and slow.exit_code == 124
        run = mgr.run_id
    assert results == {i: f"{i * 3}\n" for i in range(12)}
    assert sum(batcher.batches[:-1]) == 12 and max(batcher.batches) <= 5
    assert len(batcher.batches) < 13  # gathered, not one sandbox per job
    assert await _ids_of_run(provider_name, run) == set()


@pytest.mark.docker
async def test_waiters_get_a_reused_sandbox_at_the_cap() -> None:
    # Every slot is held by the pool: a caller waiting for one must be woken when a sandbox
    # comes back reset (it holds its slot), not wait for a slot that never frees.
    require("docker")
    used: list[str] = []
    async with SandboxManager("docker", max_sandboxes=2) as mgr:
        await mgr.warm(SPEC, 2, wait=False)  # made in the background, racing the callers

        async def user(i: int) -> None:
            async with mgr.sandbox(SPEC, reuse=True) as sb:
                used.append(sb.id)
                await sb.exec(f"echo {i} > /workspace/mine && sleep 0.2")

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(user, i)
        assert len(used) == 6 and len(set(used)) <= 2
        assert mgr.stats["created"] == 2 and mgr.stats["reused"] >= 4
        run = mgr.run_id
    assert await _ids_of_run("docker", run) == set()
