"""ExecBatcher: many callers' commands gathered into one `Sandbox.exec_many` round trip.

Single-turn code rewards run one short test program per rollout. Rollouts scored at about
the same time hand their programs to a shared batcher; the first caller of a batch waits up
to `window_s` (or until `max_batch` jobs are in), takes one sandbox from the manager, runs
the batch there (with docker's execd: one round trip, jobs in parallel inside the
sandbox), and gives every caller its own result. Each job keeps its own timeout.

Jobs of one batch share a sandbox at the same time, so one job can see (and disturb) the
others' processes and files: use it only where the environment allows that (e.g. reference
tests of trusted solutions, or when a job's outcome cannot be changed by its neighbours in
a way that matters); it is opt-in for that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from .base import ExecJob
from .result import ExecResult
from .spec import SandboxSpec

if TYPE_CHECKING:
    from .manager import SandboxManager


@dataclass
class _Pending:
    job: ExecJob
    done: anyio.Event = field(default_factory=anyio.Event)
    result: ExecResult | None = None
    error: BaseException | None = None


class ExecBatcher:
    """Gathers `run(job)` calls into batches of up to `max_batch` for one sandbox each."""

    def __init__(
        self,
        manager: SandboxManager,
        spec: SandboxSpec,
        *,
        max_batch: int = 8,
        window_s: float = 0.005,
        reuse: bool = True,
        parallel: int | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.manager = manager
        self.spec = spec
        self.max_batch = max_batch
        self.window_s = window_s
        self.reuse = reuse
        self.parallel = parallel
        self._pending: list[_Pending] = []
        self._full = anyio.Event()
        self._leader = False
        self.batches: list[int] = []  # sizes of the batches run, for reports and tests

    async def run(self, job: ExecJob) -> ExecResult:
        me = _Pending(job)
        self._pending.append(me)
        if len(self._pending) >= self.max_batch:
            self._full.set()
        if self._leader:
            await me.done.wait()
        else:
            # This caller leads: wait for company, then take everything pending (in batches
            # of max_batch, run at once in separate sandboxes). Later callers lead the next.
            self._leader = True
            try:
                with anyio.move_on_after(self.window_s):
                    await self._full.wait()
            finally:
                taken, self._pending = self._pending, []
                self._full = anyio.Event()
                self._leader = False
            # Shielded: the other callers wait on this batch even if its leader is cancelled.
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for i in range(0, len(taken), self.max_batch):
                        tg.start_soon(self._run_batch, taken[i : i + self.max_batch])
        if me.error is not None:
            raise me.error
        assert me.result is not None
        return me.result

    async def _run_batch(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        self.batches.append(len(batch))
        try:
            async with self.manager.sandbox(self.spec, reuse=self.reuse) as sb:
                results = await sb.exec_many([p.job for p in batch], parallel=self.parallel)
            for p, r in zip(batch, results, strict=True):
                p.result = r
        except BaseException as exc:  # every caller of the batch sees the failure
            for p in batch:
                p.error = exc
        finally:
            for p in batch:
                p.done.set()
