"""SandboxManager.cool (lower a warm pool, destroying idle sandboxes past it) and
SandboxManager.destroy (a handed-out sandbox gone now, its slot free), on the local provider."""

from __future__ import annotations

import pytest

from sandgym.sandboxes import SandboxManager, SandboxSpec

pytestmark = pytest.mark.anyio

SPEC = SandboxSpec(memory_mb=256, disk_mb=16)


async def test_cool_lowers_the_pool_and_destroys_the_idle_past_it() -> None:
    async with SandboxManager("local", max_sandboxes=4) as mgr:
        await mgr.warm(SPEC, 3)
        assert (mgr.idle, mgr.live) == (3, 3)
        assert await mgr.cool(SPEC, 1) == 2
        assert (mgr.idle, mgr.live) == (1, 1)
        async with mgr.sandbox(SPEC, reuse=True):  # the pool still wants one: a pool hit
            pass
        assert mgr.stats["pool_hits"] == 1
        await mgr.cool(SPEC)  # no pool at all (the refill made meanwhile goes too)
        assert mgr.idle == 0
        async with mgr.sandbox(SPEC, reuse=True):
            pass
        assert mgr.idle == 0  # nothing pools it any more


async def test_destroy_frees_the_slot_before_returning() -> None:
    async with SandboxManager("local", max_sandboxes=1, background_recycle=True) as mgr:
        sb = await mgr.acquire(SPEC)
        await mgr.destroy(sb)
        assert mgr.live == 0 and sb.id not in {i.id for i in await mgr.provider.list()}
        await mgr.destroy(sb)  # twice is fine
        again = await mgr.acquire(SPEC)  # the one slot is free
        await mgr.release(again)
