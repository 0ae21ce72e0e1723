"""The sandbox fleet on a simulated 3-node Ray cluster: placement and caps (per node and
cluster-wide: the next create waits, then proceeds), the `ray` provider behind
SandboxManager, node-agent sessions with leases, creation-rate limiting and per-node
backoff, and a node killed under a running exec. The provider contract on `ray` is
tests/sandboxes/test_contract_ray.py."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import anyio
import pytest

from sandgym.core.failures import classify
from sandgym.sandboxes import SandboxLostError, SandboxManager, SandboxSpec
from sandgym.sandboxes.base import ExecJob
from sandgym.sandboxes.ownership import new_run_id, owner_labels
from sandgym.sandboxes.providers.ray.ratelimit import Backoff, TokenBucket

from .conftest import NODE_CAP, node_containers

pytestmark = pytest.mark.anyio

SPEC = SandboxSpec(cpu=0.25, memory_mb=128, disk_mb=16, exec_timeout_s=30)


async def until(cond: Any, what: str, timeout: float = 60.0) -> None:
    """Poll `cond()` until true; fail naming `what` past `timeout` (a bound, not a measurement)."""
    with anyio.fail_after(timeout):
        while not cond():
            await anyio.sleep(0.05)


def by_node(sbs: list[Any]) -> Counter[str]:
    return Counter(sb.node.name for sb in sbs)


async def test_cluster_wide_cap_waits_then_proceeds(cluster: Any) -> None:
    from sandgym.sandboxes.providers.ray import Fleet

    async with Fleet(cluster.address, max_sandboxes=4) as fleet:
        assert [n.name for n in fleet.ready_nodes()] == cluster.names
        sbs = [await fleet.create(SPEC, owner_labels(new_run_id())) for _ in range(4)]
        counts = by_node(sbs)
        assert len(counts) == 3 and max(counts.values()) == 2  # spread where the room is
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _create_into(fleet, got))
            await until(lambda: fleet.waiting == 1, "the 5th create waiting")
            assert not got and fleet.stats["create_waits"] == 1
            await sbs.pop().close()  # one released: the waiting create goes on
        assert len(got) == 1 and (await got[0].exec("echo ok")).stdout == "ok\n"
        assert sum(len(n.held) for n in fleet.nodes.values()) == 4
        for sb in sbs + got:
            await sb.close()


async def _create_into(fleet: Any, out: list[Any]) -> None:
    out.append(await fleet.create(SPEC, owner_labels(new_run_id())))


async def test_per_node_cap_waits_and_the_freed_node_takes_the_next(cluster: Any) -> None:
    from sandgym.sandboxes.providers.ray import Fleet

    async with Fleet(cluster.address) as fleet:
        assert {n.cap for n in fleet.ready_nodes()} == {NODE_CAP}  # advertised by each node
        sbs = [await fleet.create(SPEC, owner_labels(new_run_id())) for _ in range(3 * NODE_CAP)]
        assert by_node(sbs) == Counter({n: NODE_CAP for n in cluster.names})
        for node in fleet.ready_nodes():
            info = await fleet.call(node, "info")
            assert info["live"] <= info["cap"] == NODE_CAP
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _create_into(fleet, got))
            await until(lambda: fleet.waiting == 1, "a create waiting for a full cluster")
            freed = next(sb for sb in sbs if sb.node.name == cluster.names[1])
            sbs.remove(freed)
            await freed.close()
        assert got[0].node.name == cluster.names[1]
        for sb in sbs + got:
            await sb.close()


async def test_the_node_cap_holds_across_fleets(cluster: Any) -> None:
    """The agent's cap is the machine's, whoever asks: a second driver's create waits there."""
    from sandgym.sandboxes.providers.ray import Fleet

    node = cluster.names[0]
    async with Fleet(cluster.address, nodes=[node]) as a, Fleet(cluster.address, nodes=[node]) as b:
        held = [await a.create(SPEC, owner_labels(new_run_id())) for _ in range(NODE_CAP)]
        got: list[Any] = []
        (bn,) = b.ready_nodes()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _create_into(b, got))
            with anyio.fail_after(60):  # b's create reached the agent and waits there
                while (await b.call(bn, "info"))["waiting_creates"] != 1:
                    await anyio.sleep(0.05)
            assert not got
            await held.pop().close()
        assert got[0].node.name == node
        for sb in held + got:
            await sb.close()


async def test_sandbox_manager_over_the_fleet(cluster: Any) -> None:
    """The SandboxManager API is unchanged: its cap, warm pools and reuse work over `ray`."""
    async with SandboxManager("ray", max_sandboxes=4, provider_options={"address": cluster.address}) as mgr:
        await mgr.warm(SPEC, 2)
        assert mgr.idle == 2
        async with mgr.sandbox(SPEC, reuse=True) as sb:
            assert sb.provider == "ray"
            await sb.write_file("x.txt", "hello")
            assert (await sb.exec("cat x.txt")).stdout == "hello"
            r = await sb.exec_many([ExecJob(["echo", str(i)]) for i in range(3)])
            assert [x.stdout for x in r] == ["0\n", "1\n", "2\n"]
        assert mgr.stats["pool_hits"] == 1
        # The lease's refill of the pool runs in the background; when it ends after the reused
        # sandbox is back, the pool is full and it destroys what it made, and a sandbox being
        # destroyed counts as live until it is gone (CI saw 2 listed, 3 live). Wait for that.
        with anyio.fail_after(60):
            while len(listed := await mgr.provider.list({"sandgym.owner": mgr.run_id})) != mgr.live:
                await anyio.sleep(0.1)
        assert all(i.provider == "ray" for i in listed)
    assert not await _session_sandboxes(cluster, mgr.run_id)


async def _session_sandboxes(cluster: Any, owner: str) -> list[Any]:
    from sandgym.sandboxes.providers.ray import RayProvider

    p = RayProvider(cluster.address)
    try:
        return await p.list({"sandgym.owner": owner})
    finally:
        await p.aclose()


async def test_a_session_whose_driver_stops_renewing_is_closed(cluster: Any) -> None:
    """A driver that dies (no heartbeats) leaks nothing: its lease runs out on the agent."""
    from sandgym.sandboxes.providers.ray import Fleet

    node = cluster.names[2]
    fleet = Fleet(cluster.address, nodes=[node], lease_s=1.0)
    await fleet.start()
    sb = await fleet.create(SPEC, owner_labels(new_run_id()))
    fleet._monitor.cancel()  # this driver goes silent (as if killed): no more heartbeats
    (fn,) = fleet.ready_nodes()
    with anyio.fail_after(60):
        while sb.id in {i.id for i in await fleet.call(fn, "list", None)}:
            await anyio.sleep(0.2)
    assert not await sb.alive()
    fleet._closed = True  # nothing left to close


def test_token_bucket_and_backoff_arithmetic() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.try_acquire() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert bucket.try_acquire() == pytest.approx(0.5)  # then one every 1/rate s
    now[0] += 0.5
    assert bucket.try_acquire() == 0.0
    now[0] += 10
    assert [bucket.try_acquire() for _ in range(4)][-1] > 0  # never more than `burst` saved
    b = Backoff(base_s=1.0, cap_s=5.0, clock=lambda: now[0])
    assert [b.fail() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.remaining() == 5.0
    b.succeed()
    assert b.remaining() == 0.0 and b.failures == 0
    with pytest.raises(ValueError):
        TokenBucket(rate=0)


async def test_creates_are_rate_limited(cluster: Any) -> None:
    from sandgym.sandboxes.providers.ray import Fleet

    async with Fleet(cluster.address, create_rate=1.0, create_burst=1) as fleet:
        out: list[Any] = []
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(_create_into, fleet, out)
        assert len(out) == 3 and fleet.rate.waits == 2  # the 2nd and 3rd waited for a token
        for sb in out:
            await sb.close()


async def test_a_failing_node_backs_off_and_creates_go_elsewhere(cluster: Any) -> None:
    """A node whose provider cannot create (its socket root is unusable) fails the create;
    the fleet backs off from it and places the create, and the next, on a healthy node."""
    from sandgym.sandboxes.providers.ray import Fleet
    from sandgym.sandboxes.providers.ray.cluster import stop_agents

    bad = f"t{os.getpid()}bad"
    good = cluster.names[0]
    cluster.add_node(bad)
    try:
        fleet = Fleet(cluster.address, nodes=[bad, good], backoff_s=30.0,
                      agent_provider_options={"socket_root": "/proc/no-such-dir"})
        async with fleet:
            first = await fleet.create(SPEC, owner_labels(new_run_id()))
            assert first.node.name == good
            assert fleet.stats["create_failures"] == 1
            assert fleet.nodes[bad].backoff.remaining() > 0
            second = await fleet.create(SPEC, owner_labels(new_run_id()))
            assert second.node.name == good  # the empty but failing node is left alone
            await first.close()
            await second.close()
    finally:
        stop_agents([bad])
        cluster.remove_node(bad)  # later tests see the cluster's own nodes only


async def test_a_killed_node_ends_its_calls_and_is_pruned_when_it_returns(cluster: Any) -> None:
    from sandgym.sandboxes.providers.ray import Fleet

    victim = cluster.names[1]
    async with Fleet(cluster.address, nodes=[victim]) as fleet:
        (node,) = fleet.ready_nodes()
        agent_pid = (await fleet.call(node, "info"))["pid"]
        sbs = [await fleet.create(SPEC, owner_labels(new_run_id())) for _ in range(2)]
        assert len(node_containers([victim])) >= 2
        caught: list[BaseException] = []

        async def long_exec() -> None:
            try:
                await sbs[0].exec("sleep 600")
            except SandboxLostError as exc:
                caught.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_exec)
            await anyio.sleep(0.5)
            killed_at = time.monotonic()
            await anyio.to_thread.run_sync(cluster.kill_node, victim)
        # The exec ended with the node, long before its command would have.
        assert caught and classify(caught[0]) == "sandbox"
        assert time.monotonic() - killed_at < 120
        assert node.state == "lost" and fleet.stats["lost_sandboxes"] == 2
        with pytest.raises(SandboxLostError):
            await sbs[1].exec("true")
        assert not await sbs[1].alive()
        with anyio.fail_after(30):  # the agent's process died with its node
            while os.path.exists(f"/proc/{agent_pid}"):
                await anyio.sleep(0.1)
        # What the dead node left goes without anyone calling prune: the sandboxes stop
        # themselves once their lifeline's holder (the agent) is gone, and any sandgym
        # manager on the host reaps them (issue 19); a returning node prunes by label too.
        with anyio.fail_after(90):
            while node_containers([victim]):
                await anyio.sleep(0.5)

        cluster.add_node(victim)  # the machine comes back
        with anyio.fail_after(120):
            while not (fleet.nodes[victim].ready):
                await anyio.sleep(0.1)
        joined = [e for e in fleet.events if e["event"] == "joined" and e["node"] == victim]
        assert joined  # the node rejoined the fleet
        sb = await fleet.create(SPEC, owner_labels(new_run_id()))
        assert (await sb.exec("echo back")).stdout == "back\n"
        await sb.close()
