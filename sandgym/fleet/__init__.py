"""Rollouts and training across the machines of a Ray cluster, on the `ray` sandbox provider
(sandgym.sandboxes.providers.ray: node agents, the fleet, placement of sandboxes, node loss).

jobs.py (what a driver sends a node: the environment and the policy, by name), rollouts.py
(what runs on the node: a rollout or a group next to its sandboxes), driver.py (the
driver: `sandgym eval --ray`, the trainer's rollout source, bounded retries of lost work),
placement.py (placement groups for the trainer's ranks and its inference backend).
"""

from .jobs import ClientSpec, EnvSpec

__all__ = ["ClientSpec", "EnvSpec"]
