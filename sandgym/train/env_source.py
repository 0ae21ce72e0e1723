"""EnvRolloutSource: the trainer's rollouts from a sandgym environment (sandgym.core;
verifiers-style API), a RolloutSource (rollout_source.py).

`env.generate(client, model, rows, rollouts_per_example=G)` rolls out each row G times
(sandboxed tool calls included), scores each group with the environment's Rubric, and returns
the States in row order; the client is core's OpenAIClient against the trainer's inference
backend, asking for token ids and logprobs and sending later turns as token ids (token-in:
core/tokens.py). Sandboxes live for the run: `sandbox_session()` opens one SandboxManager that the
concurrent groups share (sandboxes are reused across steps) and destroys what it made on exit;
a call outside one opens its own for that call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sandgym.core.state import State
from sandgym.errors import UserError


class EnvRolloutSource:
    def __init__(
        self,
        name: str,
        args: dict[str, Any],
        provider: str = "docker",
        max_sandboxes: int = 8,
        token_in: bool = True,
        warm_sandboxes: int = 0,
    ) -> None:
        from sandgym import envs

        self.env = envs.load_environment(name, **args)
        self.name = self.env.name
        self.provider = provider
        self.max_sandboxes = max_sandboxes
        self.token_in = token_in
        self.warm_sandboxes = min(warm_sandboxes, max_sandboxes)
        self.rows = self.env.rows(None, split="train")
        if not self.rows:
            raise UserError(f"environment {name!r} has no training rows")
        self._in_sandbox_session = False

    def rows_at(self, start: int, count: int) -> list[dict[str, Any]]:
        # The data position cycles through the dataset (epochs), deterministically.
        return [self.rows[(start + i) % len(self.rows)] for i in range(count)]

    async def generate_groups(
        self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict[str, Any], max_concurrent: int
    ) -> list[list[State]]:
        from sandgym.core.clients import OpenAIClient

        client = OpenAIClient(base_url=base_url, api_key="sandgym", request_tokens=True, token_in=self.token_in)
        rows = self.rows_at(start, count)

        async def go() -> list[State]:
            return await self.env.generate(
                client, model, rows, rollouts_per_example=group_size, max_concurrent=max_concurrent, sampling_args=sampling
            )

        try:
            if self._in_sandbox_session:
                states = await go()
            else:
                async with self.env.sandbox_session(self.provider, max_sandboxes=self.max_sandboxes, warm=self.warm_sandboxes):
                    states = await go()
        finally:
            await client.aclose()
        return [states[i : i + group_size] for i in range(0, len(states), group_size)]

    @asynccontextmanager
    async def sandbox_session(self) -> AsyncIterator[None]:
        async with self.env.sandbox_session(self.provider, max_sandboxes=self.max_sandboxes, warm=self.warm_sandboxes):
            self._in_sandbox_session = True
            try:
                yield
            finally:
                self._in_sandbox_session = False
