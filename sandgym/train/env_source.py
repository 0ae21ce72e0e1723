"""EnvRolloutSource: the trainer's rollouts from a sandgym environment (sandgym.core;
verifiers-style API), a RolloutSource (rollout_source.py).

`env.generate(client, model, rows, rollouts_per_example=G)` rolls out each row G times
(sandboxed tool calls included), scores each group with the environment's Rubric, and returns
the States in row order; the client is core's OpenAIClient against the trainer's inference
backend, asking for token ids and logprobs. Sandboxes live for one step: a SandboxManager is
opened around each generation batch and destroys what it made on exit.
"""

from __future__ import annotations

from typing import Any

from sandgym.core.state import State
from sandgym.errors import UserError


class EnvRolloutSource:
    def __init__(self, name: str, args: dict[str, Any], provider: str = "docker", max_sandboxes: int = 8) -> None:
        from sandgym import envs

        self.env = envs.load_environment(name, **args)
        self.name = self.env.name
        self.provider = provider
        self.max_sandboxes = max_sandboxes
        self.rows = self.env.rows(None, split="train")
        if not self.rows:
            raise UserError(f"environment {name!r} has no training rows")

    def rows_at(self, start: int, count: int) -> list[dict[str, Any]]:
        # The data position cycles through the dataset (epochs), deterministically.
        return [self.rows[(start + i) % len(self.rows)] for i in range(count)]

    async def generate_groups(
        self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict[str, Any], max_concurrent: int
    ) -> list[list[State]]:
        from sandgym.core.clients import OpenAIClient

        client = OpenAIClient(base_url=base_url, api_key="sandgym", request_tokens=True)
        rows = self.rows_at(start, count)
        try:
            async with self.env.sandbox_session(self.provider, max_sandboxes=self.max_sandboxes):
                states = await self.env.generate(
                    client, model, rows, rollouts_per_example=group_size, max_concurrent=max_concurrent, sampling_args=sampling
                )
        finally:
            await client.aclose()
        return [states[i : i + group_size] for i in range(0, len(states), group_size)]
