"""The trainer's rollout source: what produces a step's groups of rollouts.

Implementations: env_source.EnvRolloutSource (a sandgym environment: `[env] kind = "sandgym"`),
ray_source.RayRolloutSource (the same on a Ray fleet: `[env] ray_address`) and toy.ToyTask
(`[env] kind = "toy"`). The trainer's rollout pipeline (pipeline.py) calls `generate_groups`
for one group at a time, many concurrently, inside the `sandbox_session()` that spans the run, with
the inference backend's endpoint; the source talks to it like any OpenAI-compatible server
and returns States carrying token ids (with the policy version of each response), rewards and
(optionally) advantages.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

from sandgym.core.state import State


@runtime_checkable
class RolloutSource(Protocol):
    name: str  # recorded on each State (`State.env`)

    async def generate_groups(
        self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict[str, Any], max_concurrent: int
    ) -> list[list[State]]:
        """`count` groups of `group_size` rollouts for dataset positions start .. start+count-1
        (a source cycles its data); at most `max_concurrent` rollouts in flight; `sampling`
        holds max_tokens, temperature, top_p. A failed rollout is a State with `error` and
        `error_kind` set (core/failures.py); an exception means the source itself is broken."""
        ...

    def sandbox_session(self) -> AbstractAsyncContextManager[None]:
        """The environment's sandbox session for the whole run (Environment.sandbox_session: a
        sandbox manager shared by the concurrent `generate_groups` calls; a source without
        sandboxes holds nothing); entered and left in the pipeline's event loop."""
        ...
