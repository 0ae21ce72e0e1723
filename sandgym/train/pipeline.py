"""The rollout pipeline: groups generated in an event loop of their own (a BlockingPortal's
thread), ahead of training by at most `async_level` steps.

Groups are launched one dataset row at a time (`RolloutSource.generate_groups(start=row,
count=1)`), so a slow group never holds up the others. The groups of step n are launched as
soon as the inference backend serves the weights of step n - async_level (`set_version`):
with async_level 0 that is after step n - 1 finished (synchronous training); with k > 0
generation of the next k steps goes on while the trainer trains, and weights are pushed to the
backend under the rollouts in flight. The trainer takes finished groups in the order they
finish (`next_group`) and asks for more when it drops some (`launch_extra`: DAPO's dynamic
sampling, stale groups). Every launch takes the next dataset row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import anyio

from sandgym.core.state import State
from sandgym.train.rollout_source import RolloutSource


@dataclass
class ReadyGroup:
    """One finished group: the dataset row, its rollouts, the policy version the backend
    served when it started, or the error that stopped the source itself."""

    row: int
    states: list[State]
    launch_version: int
    error: BaseException | None = None

    def version(self) -> int:
        """The oldest policy version that generated any turn of a valid rollout (the server
        says per response); the launch version where the server did not say."""
        versions = [
            t.tokens.policy_version
            for s in self.states
            if not s.failed
            for t in s.turns
            if t.tokens is not None and t.tokens.policy_version is not None
        ]
        return min(versions) if versions else self.launch_version


class RolloutPipeline:
    """Lives in one anyio event loop: `run` holds the task group of the groups in flight;
    the trainer thread calls the other methods through the portal."""

    def __init__(
        self,
        source: RolloutSource,
        base_url: str,
        model: str,
        sampling: dict[str, Any],
        group_size: int,
        groups_per_step: int,
        max_concurrent: int,
        async_level: int,
        next_row: int,
        last_batch: int,
    ) -> None:
        self.source = source
        self.base_url = base_url
        self.model = model
        self.sampling = sampling
        self.group_size = group_size
        self.groups_per_step = groups_per_step
        self.async_level = async_level
        self.next_row = next_row
        self.last_batch = last_batch  # the last step's index: nothing is scheduled past it
        self.version = -1
        self.scheduled = -1  # the highest step whose groups were launched
        self.outstanding: set[int] = set()  # rows launched and not yet taken by the trainer
        # Rollouts in flight: whole groups of `group_size` share `max_concurrent`.
        self._groups_limit = anyio.CapacityLimiter(max(1, max_concurrent // group_size))
        self._per_call = min(group_size, max_concurrent)
        self._send, self._recv = anyio.create_memory_object_stream[ReadyGroup](math.inf)
        self._tg: anyio.abc.TaskGroup | None = None
        self._done = anyio.Event()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._done.set()

    async def stop(self) -> None:
        """Cancel the groups in flight and wait for them to unwind."""
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._done.wait()

    async def set_version(self, version: int) -> None:
        """The backend now serves `version`: launch every step's groups that may start."""
        self.version = version
        if self.scheduled < version - 1:
            self.scheduled = version - 1  # (a resumed run starts at its step)
        while self.scheduled < min(version + self.async_level, self.last_batch):
            self.scheduled += 1
            for _ in range(self.groups_per_step):
                self._launch()

    async def launch_extra(self, n: int) -> None:
        """Launch `n` groups now, on the weights being served."""
        for _ in range(n):
            self._launch()

    def in_flight(self) -> int:
        """Groups launched and not yet taken (finished ones waiting included)."""
        return len(self.outstanding)

    def data_position(self) -> int:
        """Where a resumed run starts: the first row not yet taken (rows in flight at a
        checkpoint are generated again after a resume)."""
        return min(self.outstanding) if self.outstanding else self.next_row

    async def next_group(self) -> ReadyGroup:
        g = await self._recv.receive()
        self.outstanding.discard(g.row)
        return g

    def _launch(self) -> None:
        if self._tg is None:
            raise RuntimeError("the rollout pipeline is not running")
        row = self.next_row
        self.next_row += 1
        self.outstanding.add(row)
        self._tg.start_soon(self._group, row)

    async def _group(self, row: int) -> None:
        async with self._groups_limit:
            version = self.version
            try:
                groups = await self.source.generate_groups(
                    self.base_url, self.model, row, 1, self.group_size, self.sampling, self._per_call
                )
                ready = ReadyGroup(row, groups[0] if groups else [], version)
            except Exception as exc:  # the source itself broke (not one rollout): the trainer raises it
                ready = ReadyGroup(row, [], version, error=exc)
        await self._send.send(ready)
