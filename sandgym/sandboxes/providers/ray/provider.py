"""The `ray` provider: a fleet of node agents behind the ordinary Provider protocol, so
`SandboxManager("ray", provider_options={"address": ...})` -- and everything built on it:
environments, `sandgym serve` -- works across machines unchanged.

Every call of a `RaySandbox` (sandbox.py) goes straight to the agent of the node that holds it. When that
node is lost, the call raises `SandboxLostError` (a `SandboxGoneError`), so a rollout using
it fails as "sandbox" -- an infrastructure failure, never a reward of 0 for the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...result import SandboxInfo
from ...spec import SandboxSpec
from .fleet import Fleet
from .sandbox import RaySandbox


class RayProvider:
    """Sandboxes on the sandgym nodes of a Ray cluster (fleet.py). Options are the Fleet's:
    `address`, `max_sandboxes` (cluster-wide), `max_per_node`, `create_rate`, ..."""

    name = "ray"

    def __init__(self, address: str | None = None, *, fleet: Fleet | None = None, **fleet_options: Any) -> None:
        self.fleet = fleet if fleet is not None else Fleet(address, **fleet_options)

    def check(self, spec: SandboxSpec) -> None:
        """Nothing to check here without a round trip: the node's own provider checks the
        spec at create, and its SpecError comes back as itself."""

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> RaySandbox:
        return await self.fleet.create(spec, labels)

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        return await self.fleet.list(labels)

    async def adopt(self, sandbox_id: str, spec: SandboxSpec) -> RaySandbox:
        """A platform sandbox made before a server restart (see fleet.py), as a sandbox
        again; SandboxGoneError when no node holds it running."""
        sb: RaySandbox = await self.fleet.adopt(sandbox_id, spec)
        return sb

    async def remove(self, sandbox_id: str) -> None:
        await self.fleet.remove(sandbox_id)

    async def aclose(self) -> None:
        await self.fleet.close()
