"""RayRolloutSource: the trainer's rollouts on a Ray fleet (`[env] ray_address = "HOST:PORT"`).

Each generation batch's groups run on the cluster's sandgym nodes (sandgym.fleet.driver), next
to their sandboxes, asking the trainer's inference backend over HTTP -- so that backend's
address must be reachable from the nodes (on one machine, 127.0.0.1 is). A group lost with
its node is run again elsewhere; one that keeps failing comes back as failed rollouts, which
the trainer masks out of the loss."""

from __future__ import annotations

from typing import Any

from sandgym.core.state import State

from .env_source import EnvRolloutSource


class RayRolloutSource(EnvRolloutSource):
    """A RolloutSource (rollout_source.py) whose groups run on a Ray fleet."""

    def __init__(self, name: str, args: dict[str, Any], address: str, node_retries: int = 2) -> None:
        super().__init__(name, args)
        self.address = address
        self.node_retries = node_retries
        self.env_name = name
        self.env_args = dict(args)

    async def generate_groups(
        self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict[str, Any], max_concurrent: int
    ) -> list[list[State]]:
        from sandgym.fleet.driver import generate_groups
        from sandgym.fleet.jobs import ClientSpec, EnvSpec
        from sandgym.sandboxes.providers.ray import Fleet

        client = ClientSpec(model=model, base_url=base_url, api_key="sandgym", request_tokens=True)
        async with Fleet(self.address) as fleet:
            return await generate_groups(
                fleet, self.env, EnvSpec(name=self.env_name, args=self.env_args), client, self.rows_at(start, count),
                group_size, max_concurrent=max_concurrent, sampling_args=sampling, node_retries=self.node_retries,
            )
