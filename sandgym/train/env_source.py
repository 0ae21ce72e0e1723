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
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from sandgym.core.state import State
from sandgym.errors import UserError

if TYPE_CHECKING:
    from sandgym.core.clients import OpenAIClient


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
        self._clients: dict[str, OpenAIClient] | None = None  # inside sandbox_session()
        self._session_loop: object = None

    def rows_at(self, start: int, count: int) -> list[dict[str, Any]]:
        # The data position cycles through the dataset (epochs), deterministically.
        return [self.rows[(start + i) % len(self.rows)] for i in range(count)]

    async def generate_groups(
        self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict[str, Any], max_concurrent: int
    ) -> list[list[State]]:
        rows = self.rows_at(start, count)

        async def go(client: OpenAIClient) -> list[State]:
            return await self.env.generate(
                client, model, rows, rollouts_per_example=group_size, max_concurrent=max_concurrent, sampling_args=sampling
            )

        if self._clients is not None and self._session_loop == anyio.lowlevel.current_token():
            # In the run's sandbox session, on its event loop: the session's client for this server.
            client = self._clients.get(base_url)
            if client is None:
                client = self._clients[base_url] = self._client(base_url)
            states = await go(client)
        else:
            client = self._client(base_url)
            try:
                if self._clients is not None:
                    states = await go(client)
                else:
                    async with self.env.sandbox_session(self.provider, max_sandboxes=self.max_sandboxes, warm=self.warm_sandboxes):
                        states = await go(client)
            finally:
                await client.aclose()
        return [states[i : i + group_size] for i in range(0, len(states), group_size)]

    def _client(self, base_url: str) -> OpenAIClient:
        from sandgym.core.clients import OpenAIClient

        return OpenAIClient(base_url=base_url, api_key="sandgym", request_tokens=True, token_in=self.token_in)

    @asynccontextmanager
    async def sandbox_session(self) -> AsyncIterator[None]:
        """Sandboxes, and the inference clients, for the run: one client per server, made on
        first use (making one costs an SSL context, ~30 ms, which every group paid)."""
        async with self.env.sandbox_session(self.provider, max_sandboxes=self.max_sandboxes, warm=self.warm_sandboxes):
            self._clients, self._session_loop = {}, anyio.lowlevel.current_token()
            try:
                yield
            finally:
                clients, self._clients = self._clients, None
                for client in clients.values():
                    await client.aclose()
