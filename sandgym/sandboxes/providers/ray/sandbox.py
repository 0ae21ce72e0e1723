"""A sandbox on a Ray fleet's node (`RaySandbox`): every call goes straight to the agent of
the node that holds it; when that node is lost, the call raises `SandboxLostError`. It needs
of the fleet only `FleetCalls` (fleet.py's `Fleet`), so the fleet can make these without an
import circle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ...base import Command, ExecJob, Sandbox
from ...errors import SandboxLostError
from ...result import ExecResult
from ...spec import SandboxSpec


class NodeState(Protocol):
    """What a sandbox reads of its node (fleet.py's `FleetNode`)."""

    name: str
    state: str


class FleetCalls(Protocol):
    """What a sandbox asks of its fleet (fleet.py's `Fleet`)."""

    async def call(self, node: Any, method: str, *args: Any) -> Any: ...

    async def destroy(self, sandbox_id: str) -> None: ...

    def forget(self, sandbox_id: str) -> None: ...


class RaySandbox(Sandbox):
    provider = "ray"

    def __init__(self, fleet: FleetCalls, node: NodeState, sandbox_id: str, spec: SandboxSpec) -> None:
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
