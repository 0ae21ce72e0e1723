"""SandboxManager: the cap, cancellation, hooks, warm pools, retries, TTL and prune."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import anyio.lowlevel
import pytest

from sandgym.sandboxes import (
    HookError,
    SandboxCreateError,
    SandboxManager,
    SandboxSpec,
    SpecError,
    get_provider,
)
from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.spec import LABEL_OWNER
from tests.conftest import require

pytestmark = pytest.mark.anyio

SPEC = SandboxSpec(memory_mb=256, disk_mb=64)


async def _ids_of_run(provider_name: str, run_id: str) -> set[str]:
    p = get_provider(provider_name)
    try:
        return {i.id for i in await p.list({LABEL_OWNER: run_id})}
    finally:
        await p.aclose()


async def test_hooks_run_in_order() -> None:
    events: list[str] = []

    async def on_ready(sb: Sandbox) -> None:
        await anyio.lowlevel.checkpoint()
        events.append("on_ready")

    hooks = {
        "on_create": lambda sb: events.append("on_create"),
        "on_ready": on_ready,
        "before_exec": lambda sb, cmd: events.append(f"before_exec:{cmd}"),
        "after_exec": lambda sb, cmd, r: events.append(f"after_exec:{r.stdout.strip()}"),
        "on_release": lambda sb: events.append("on_release"),
        "on_destroy": lambda sb: events.append("on_destroy"),
    }
    async with SandboxManager("local", hooks=hooks) as mgr:
        async with mgr.sandbox(SPEC) as sb:
            await sb.exec("echo hi")
    assert events == ["on_create", "on_ready", "before_exec:echo hi", "after_exec:hi", "on_release", "on_destroy"]


async def test_failing_hook_fails_that_sandbox_not_the_process() -> None:
    calls = {"n": 0}

    def flaky_ready(sb: Sandbox) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")

    async with SandboxManager("local", hooks={"on_ready": flaky_ready}) as mgr:
        with pytest.raises(HookError, match="boom"):
            await mgr.acquire(SPEC)
        assert mgr.live == 0  # the failed sandbox was destroyed and its slot freed
        async with mgr.sandbox(SPEC) as sb:  # the next one is fine
            assert (await sb.exec("echo ok")).stdout == "ok\n"

    def bad_exec(sb: Sandbox, cmd: object) -> None:
        raise ValueError("refused")

    async with SandboxManager("local", hooks={"before_exec": bad_exec}) as mgr:
        async with mgr.sandbox(SPEC) as sb:
            with pytest.raises(HookError, match="refused"):
                await sb.exec("true")
            assert sb.failed
        assert mgr.live == 0


async def test_cap_holds_under_3x_demand_and_cancellation() -> None:
    cap = 3
    live = {"now": 0, "max": 0}

    def up(sb: Sandbox) -> None:
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])

    def down(sb: Sandbox) -> None:
        live["now"] -= 1

    async with SandboxManager("local", max_sandboxes=cap, hooks={"on_create": up, "on_destroy": down}) as mgr:
        async def work(i: int) -> None:
            async with mgr.sandbox(SPEC) as sb:
                assert mgr.live <= cap
                await sb.exec(f"echo {i}")
                await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            for i in range(3 * cap):
                tg.start_soon(work, i)
        assert live["max"] == cap, live
        assert mgr.live == 0

        # Cancel a crowd of waiters and holders half-way: nothing may leak or overshoot.
        with anyio.move_on_after(0.3):
            async with anyio.create_task_group() as tg:
                for i in range(3 * cap):
                    tg.start_soon(work, i)
        assert live["max"] == cap
        assert mgr.live == 0 and live["now"] == 0
        async with mgr.sandbox(SPEC) as sb:  # every slot came back
            assert (await sb.exec("echo again")).exit_code == 0


async def test_warm_pool_hands_out_ready_sandboxes_and_refills() -> None:
    async with SandboxManager("local", max_sandboxes=4) as mgr:
        await mgr.warm(SPEC, 2)
        assert mgr.idle == 2
        sb = await mgr.acquire(SPEC)
        assert mgr.stats["pool_hits"] == 1
        with anyio.fail_after(30):
            while mgr.idle < 2:  # refilled in the background
                await anyio.sleep(0.02)
        await mgr.release(sb)
        assert mgr.live == 2
        # Idle warm sandboxes of another spec are evicted rather than starving a caller.
        other = SPEC.model_copy(update={"memory_mb": 300})
        held = [await mgr.acquire(other) for _ in range(4)]
        assert mgr.live == 4
        for h in held:
            await mgr.release(h)
    assert mgr.live == 0


class _FlakyProvider:
    """The real local provider, failing its first `fail` creates (fault injection)."""

    def __init__(self, fail: int) -> None:
        self.inner = get_provider("local")
        self.name = "local"
        self.fail = fail
        self.attempts = 0
        self.checks = 0

    def check(self, spec: SandboxSpec) -> None:
        self.checks += 1
        self.inner.check(spec)

    async def create(self, spec, labels):  # type: ignore[no-untyped-def]
        self.attempts += 1
        if self.attempts <= self.fail:
            raise OSError("engine hiccup")
        return await self.inner.create(spec, labels)

    async def list(self, labels=None):  # type: ignore[no-untyped-def]
        return await self.inner.list(labels)

    async def remove(self, sandbox_id: str) -> None:
        await self.inner.remove(sandbox_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_create_retries_with_backoff_then_gives_up() -> None:
    flaky = _FlakyProvider(fail=2)
    async with SandboxManager(flaky, create_retries=2, retry_backoff_s=0.01) as mgr:
        async with mgr.sandbox(SPEC) as sb:
            assert (await sb.exec("echo up")).stdout == "up\n"
    assert flaky.attempts == 3
    hopeless = _FlakyProvider(fail=10)
    async with SandboxManager(hopeless, create_retries=1, retry_backoff_s=0.01) as mgr:
        with pytest.raises(SandboxCreateError, match="engine hiccup"):
            await mgr.acquire(SPEC)
        assert mgr.live == 0
        async with anyio.create_task_group():  # the slot was given back
            pass
    assert hopeless.attempts == 2


async def test_a_spec_is_checked_once_and_again_after_a_failed_create() -> None:
    """provider.check blocks the event loop (the Docker engine's answers): once per spec, not
    per lease; after a create that failed for the provider's sake, asked again."""
    flaky = _FlakyProvider(fail=1)
    async with SandboxManager(flaky, create_retries=0, max_sandboxes=1) as mgr:
        with pytest.raises(SandboxCreateError, match="engine hiccup"):
            await mgr.acquire(SPEC)
        for _ in range(3):  # no reuse: each lease makes a sandbox
            async with mgr.sandbox(SPEC) as sb:
                assert (await sb.exec("true")).ok
    assert (flaky.checks, flaky.attempts) == (2, 4)


async def test_lowering_a_warm_pool_asks_nothing_of_the_provider() -> None:
    """An eval lowers its pool near its end; with the engine away (a Docker restart) that
    must not fail: nothing is made, so nothing is checked. Raising it checks again."""
    flaky = _FlakyProvider(fail=0)
    async with SandboxManager(flaky, max_sandboxes=2) as mgr:
        await mgr.warm(SPEC, 2)
        assert flaky.checks == 1
        flaky.check = _engine_away  # type: ignore[method-assign]
        await mgr.warm(SPEC, 1, wait=False)
        await mgr.warm(SPEC, 0, wait=False)
        with pytest.raises(SandboxCreateError, match="does not answer"):
            await mgr.warm(SPEC, 2, wait=False)


def _engine_away(spec: SandboxSpec) -> None:
    raise SandboxCreateError("the engine does not answer")


async def test_ttl_reaper_destroys_expired() -> None:
    async with SandboxManager("local", reap_interval_s=0.1) as mgr:
        sb = await mgr.acquire(SPEC.model_copy(update={"ttl_s": 0.3}))
        with anyio.fail_after(10):
            while mgr.live:
                await anyio.sleep(0.05)
        assert sb.id not in await _ids_of_run("local", mgr.run_id)


async def test_invalid_spec_fails_before_any_sandbox() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxSpec(memory_mb=-1)
    with pytest.raises(ValueError, match=r"cpu=.*allowed range"):
        SandboxSpec(cpu=10_000)
    require("docker")
    async with SandboxManager("docker") as mgr:
        with pytest.raises(SpecError, match="image"):
            await mgr.acquire(SandboxSpec(image="sandgym/no-such-image:1"))
        assert mgr.live == 0 and mgr.stats["created"] == 0


async def test_context_manager_releases_on_error() -> None:
    async with SandboxManager("local") as mgr:
        with pytest.raises(ZeroDivisionError):
            async with mgr.sandbox(SPEC):
                raise ZeroDivisionError
        assert mgr.live == 0


@pytest.mark.parametrize("provider_name", ["docker", "local"])
async def test_sigkilled_driver_leaves_sandboxes_that_prune_removes(provider_name: str) -> None:
    if provider_name == "docker":
        require("docker")
    run_id = f"killed{os.getpid()}{int(time.time())}"
    child = textwrap.dedent(f"""
        import anyio, sys
        from sandgym.sandboxes import SandboxManager, SandboxSpec
        async def main():
            # A long grace: the sandboxes outlive their owner until prune (not their lifeline).
            mgr = SandboxManager({provider_name!r}, run_id={run_id!r}, orphan_grace_s=600)
            async with mgr:
                a = await mgr.acquire(SandboxSpec(memory_mb=128, disk_mb=16))
                b = await mgr.acquire(SandboxSpec(memory_mb=128, disk_mb=16))
                print("READY", flush=True)
                await anyio.sleep(600)
        anyio.run(main)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        assert proc.stdout is not None
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        assert line.strip() == "READY"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    orphans = await _ids_of_run(provider_name, run_id)
    assert len(orphans) == 2  # the SIGKILLed driver could not clean up
    p = get_provider(provider_name)
    try:
        from sandgym.sandboxes import prune

        report = await prune(p)
    finally:
        await p.aclose()
    assert orphans <= set(report.removed)
    assert not await _ids_of_run(provider_name, run_id)
