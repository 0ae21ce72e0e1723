"""The `ray` provider: a fleet of node agents behind the ordinary Provider protocol, so
`SandboxManager("ray", provider_options={"address": ...})` -- and everything built on it:
environments, `sandgym serve` -- works across machines unchanged.

Every call of a `RaySandbox` goes straight to the agent of the node that holds it. When that
node is lost, the call raises `SandboxLostError` (a `SandboxGoneError`), so a rollout using
it fails as "sandbox" -- an infrastructure failure, never a reward of 0 for the policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...base import Command, ExecJob, Sandbox
from ...errors import SandboxLostError
from ...result import ExecResult, SandboxInfo
from ...spec import SandboxSpec

if TYPE_CHECKING:
    from .fleet import Fleet, FleetNode


class RaySandbox(Sandbox):
    provider = "ray"

    def __init__(self, fleet: Fleet, node: FleetNode, sandbox_id: str, spec: SandboxSpec) -> None:
        self.fleet = fleet
        self.node = node
        self.id = sandbox_id
        self.spec = spec
        self._closed = False

    def __repr__(self) -> str:
        return f"RaySandbox({self.node.name}:{self.id[:12]})"

    async def _call(self, method: str, *args: Any) -> Any:
        return await self.fleet.call(self.node, method, self.id, *args)

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        return await self._call("exec", cmd, timeout, dict(env) if env else None, cwd, stdin)

    async def exec_many(self, jobs: Sequence[ExecJob], *, parallel: int | None = None) -> list[ExecResult]:
        return await self._call("exec_many", list(jobs), parallel)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        await self._call("write_file", path, data, mode)

    async def read_file(self, path: str) -> bytes:
        return await self._call("read_file", path)

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        await self._call("put_archive", dest_dir, tar_bytes)

    async def get_archive(self, path: str) -> bytes:
        return await self._call("get_archive", path)

    async def reset(self) -> bool:
        try:
            return bool(await self._call("reset"))
        except SandboxLostError:
            return False

    async def alive(self) -> bool:
        try:
            return bool(await self._call("alive"))
        except SandboxLostError:
            return False

    @property
    def lost(self) -> bool:
        return self.node.state == "lost"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.fleet.destroy(self.id)

    async def detach(self) -> None:
        """Let go without destroying: a platform sandbox stays on its node for `adopt`."""
        if not self._closed:
            self._closed = True
            self.fleet.forget(self.id)


class RayProvider:
    """Sandboxes on the sandgym nodes of a Ray cluster (fleet.py). Options are the Fleet's:
    `address`, `max_sandboxes` (cluster-wide), `max_per_node`, `create_rate`, ..."""

    name = "ray"

    def __init__(self, address: str | None = None, *, fleet: Fleet | None = None, **fleet_options: Any) -> None:
        from .fleet import Fleet

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
