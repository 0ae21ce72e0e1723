"""What runs on a node (through `NodeAgent.run`): rollouts next to their sandboxes.

The environment is loaded once per node and held inside its sandbox session on the node's
SandboxManager while some driver uses it (so what an environment sets up for its sandbox
session, a verifier sandbox say, exists once per node, the node's hard cap covers every
sandbox, and nothing is held once the drivers are gone); the policy client is made once per
driver (what the agent keeps for a driver, `ctx.store`, goes when that driver's lease on the
agent ends). Each function returns records, as results.jsonl holds them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from sandgym.core.evaluation import record_of
from sandgym.sandboxes.cpu_bound import cpu_slots

from .jobs import ClientSpec, EnvSpec


class NodeEnv:
    """An environment on a node, inside `env.sandbox_session(manager=<the node's>)` from
    `open()` to `aclose()`, which comes when the last driver using it is gone."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.users = 0
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def open(self, manager: Any) -> None:
        async def hold() -> None:
            # The sandbox session is entered and left in this one task, as anyio wants.
            try:
                async with self.env.sandbox_session(manager=manager):
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._ready.set()

        self._task = asyncio.get_running_loop().create_task(hold())
        await self._ready.wait()
        if self._error is not None:
            raise self._error

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                pass  # reported when it happened
        await self.env.close()


class _Use:
    """A driver's use of a NodeEnv, kept in the driver's `ctx.store`: the agent closes it
    when that driver is gone."""

    def __init__(self, ctx: Any, key: str, held: NodeEnv) -> None:
        self.shared, self.lock, self.key, self.held = ctx.shared, ctx.shared_lock, key, held

    async def aclose(self) -> None:
        async with self.lock:
            self.held.users -= 1
            last = self.held.users == 0 and self.shared.get(self.key) is self.held
            if last:
                del self.shared[self.key]
        if last:
            await self.held.aclose()


async def node_env(ctx: Any, env_spec: EnvSpec) -> Any:
    """The node's instance of the environment (loaded on first use, shared by drivers)."""
    key = "env:" + env_spec.key()
    async with ctx.shared_lock:
        held = ctx.shared.get(key)
        if held is None:
            held = NodeEnv(await anyio.to_thread.run_sync(env_spec.load))
            await held.open(ctx.manager)
            ctx.shared[key] = held
        if "use:" + key not in ctx.store:
            held.users += 1
            ctx.store["use:" + key] = _Use(ctx, key, held)
    return held.env


def driver_client(ctx: Any, env_spec: EnvSpec, env: Any, client_spec: ClientSpec) -> Any:
    key = "client:" + env_spec.key() + client_spec.key()
    client = ctx.store.get(key)
    if client is None:
        client = ctx.store[key] = client_spec.build(env)
    return client


async def prepare(ctx: Any, env_spec: EnvSpec, warm: int) -> str:
    """Load the environment on this node and keep sandboxes of each of its specs ready: `warm`,
    but no more than this node's cores run at once (`cpu_slots`): warming a large cap at
    once would start that many containers together and leave the node's first scoring
    behind them."""
    env = await node_env(ctx, env_spec)
    if warm > 0:
        for spec in {s.key(): s for s in env.sandbox_specs()}.values():
            await ctx.warm(spec, min(warm, cpu_slots(spec)))
    return str(ctx.node)


async def rollout(
    ctx: Any, env_spec: EnvSpec, client_spec: ClientSpec, row: Mapping[str, Any], index: int,
    sampling_args: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """One rollout of `row`; its record."""
    env = await node_env(ctx, env_spec)
    client = driver_client(ctx, env_spec, env, client_spec)
    state = await env.rollout(client, client_spec.model, row, index, sampling_args)
    return [record_of(state)]


async def rollout_group(
    ctx: Any, env_spec: EnvSpec, client_spec: ClientSpec, row: Mapping[str, Any], indices: Sequence[int],
    sampling_args: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """The rollouts `indices` of one row, scored together (group rewards, advantages)."""
    env = await node_env(ctx, env_spec)
    client = driver_client(ctx, env_spec, env, client_spec)
    states: list[Any] = []

    async def one(i: int) -> None:
        states.append(await env.rollout(client, client_spec.model, row, i, sampling_args))

    async with anyio.create_task_group() as tg:
        for i in indices:
            tg.start_soon(one, i)
    await env.score_group(states)
    return [record_of(s) for s in sorted(states, key=lambda s: s.rollout_index)]
