"""CPU-bound work in sandboxes (running a solution's tests, a judge): how many sandboxes of a
spec the machine's cores keep busy at once, and a view of a SandboxManager that never lends
more than that to such work.

A manager's cap counts every sandbox it holds, for any purpose; on a Ray node it is shared by
every driver's rollouts. Scoring that ran as many test programs at once as the cap allows
would let a loaded node time a correct solution out, so scoring goes through
`CPUBoundSandboxes`, sized by the cores of the machine it runs on.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from .spec import SandboxSpec, host_cpus

if TYPE_CHECKING:
    from .manager import ManagedSandbox, SandboxManager


def cpu_slots(spec: SandboxSpec) -> int:
    """Sandboxes of `spec` this machine's cores can run at once, at `spec.cpu` each."""
    return max(1, math.ceil(host_cpus() / spec.cpu))


class CPUBoundSandboxes:
    """`manager`, as CPU-bound work sees it: at most `slots` of its sandboxes in use at once
    for this work, whatever the manager's cap."""

    def __init__(self, manager: SandboxManager, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.manager = manager
        self.slots = slots
        self._limit = anyio.CapacityLimiter(slots)

    @property
    def in_use(self) -> int:
        return int(self._limit.borrowed_tokens)

    @asynccontextmanager
    async def sandbox(self, spec: SandboxSpec | None = None, *, reuse: bool = False) -> AsyncIterator[ManagedSandbox]:
        """`SandboxManager.sandbox`, after waiting for one of the slots."""
        async with self._limit:
            async with self.manager.sandbox(spec, reuse=reuse) as sb:
                yield sb
