"""The node agent: one long-lived Ray actor per sandgym node, pinned there by the node's
`sandgym_node:<name>` resource (one unit, so one agent per machine). It wraps that machine's
provider in a SandboxManager -- the node's hard cap, warm pools, execd (docker's in-sandbox
exec daemon) -- and serves:

- fleets (fleet.py) that create sandboxes here and exec in them: calls come straight to
  this actor from the process holding the sandbox;
- work that belongs next to the sandboxes (`run`): a function sent by a driver runs here
  with the node's manager at hand. Distributed rollouts (sandgym.fleet) are such functions:
  the rollout runs here and only its record goes back. The agent itself knows nothing of
  environments.

Every client opens a *session* with a lease; a session not renewed within its lease (its
driver died or was cancelled) is closed here: its running work cancelled, its sandboxes
destroyed -- except those its client made as the platform's (`sandgym.owner_kind=platform`:
`sandgym serve --ray --state-dir`), which outlive their client as they do on a single host:
the agent keeps them (to their TTL) for the next server on that state to `adopt`. Containers carry `sandgym.node=<name>` and `sandgym.agent=<incarnation>`; an agent
starting on a node removes the containers of that node whose agent process is gone -- what a
node that died left behind is pruned by label when it returns.

Ray runs each agent method as a coroutine on one event loop; the actor is created with an
explicit `max_concurrency` (fleet.py), never Ray's silent default.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ...base import Command, ExecJob
from ...errors import SandboxGoneError, SandboxLostError
from ...manager import ManagedSandbox, SandboxManager
from ...ownership import LABEL_OWNER_KIND, OWNER_PROCESS, owner_alive
from ...result import ExecResult, SandboxInfo
from ...spec import SandboxSpec
from .cluster import default_node_cap

log = logging.getLogger(__name__)

LABEL_NODE = "sandgym.node"
LABEL_AGENT = "sandgym.agent"
KEPT_CHECK_S = 30.0  # how often kept (client-less) sandboxes are checked for a container that ended


@dataclass
class _Session:
    id: str
    lease_s: float
    last_seen: float = field(default_factory=time.monotonic)
    sandboxes: dict[str, ManagedSandbox] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # sandbox id -> client's labels
    store: dict[str, Any] = field(default_factory=dict)  # what `run` functions keep per session (closed with it)
    scopes: set[anyio.CancelScope] = field(default_factory=set)  # its `run` calls in progress
    warm: dict[str, tuple[SandboxSpec, int]] = field(default_factory=dict)  # spec key -> (spec, n) it asked for


class NodeAgent:
    """The actor's class (fleet.py wraps it with `ray.remote`)."""

    def __init__(
        self,
        name: str,
        max_sandboxes: int | None = None,
        provider: str = "docker",
        provider_options: Mapping[str, Any] | None = None,
        lease_check_s: float = 1.0,
    ) -> None:
        import ray

        ctx = ray.get_runtime_context()
        self.name = name
        self.ray_node_id = ctx.get_node_id()
        self.cap = max_sandboxes or self._advertised_cap(ray) or default_node_cap()
        self.provider_name = provider
        self.provider_options = dict(provider_options or {})
        self.lease_check_s = lease_check_s
        self.incarnation = uuid.uuid4().hex[:12]
        self.started_at = time.time()
        self.mgr: SandboxManager | None = None
        self.pruned: list[str] = []
        self.waiting_creates = 0
        self.runs = 0
        self._sessions: dict[str, _Session] = {}
        self._owner: dict[str, str] = {}  # sandbox id -> session id
        # The platform's sandboxes whose session ended: sandbox, its client's labels.
        self._kept: dict[str, tuple[ManagedSandbox, dict[str, str]]] = {}
        self._kept_checked = time.monotonic()
        self.shared: dict[str, Any] = {}  # what `run` functions keep for every session (closed at shutdown)
        self.shared_lock = asyncio.Lock()
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._main_task: asyncio.Task[None] | None = None
        self._start_error: BaseException | None = None

    def _advertised_cap(self, ray: Any) -> int | None:
        from .cluster import CAP_RESOURCE

        for node in ray.nodes():
            if node.get("NodeID") == self.ray_node_id:
                cap = node.get("Resources", {}).get(CAP_RESOURCE)
                return int(cap) if cap else None
        return None

    # ---- lifecycle -------------------------------------------------------------------

    async def _started(self) -> SandboxManager:
        if self._main_task is None:
            self._main_task = asyncio.get_running_loop().create_task(self._main())
        await self._ready.wait()
        if self._start_error is not None or self.mgr is None:
            raise RuntimeError(f"node agent {self.name} could not start: {self._start_error!r}")
        return self.mgr

    async def _main(self) -> None:
        try:
            async with SandboxManager(
                self.provider_name,
                max_sandboxes=self.cap,
                provider_options=self.provider_options or None,
                background_recycle=True,
                run_id=f"{self.name}-{self.incarnation}",
            ) as mgr:
                mgr.labels = {**mgr.labels, LABEL_NODE: self.name, LABEL_AGENT: self.incarnation}
                self.mgr = mgr
                self.pruned = await self._prune_orphans(mgr)
                self._ready.set()
                while not self._stop.is_set():
                    with anyio.move_on_after(self.lease_check_s):
                        await self._stop.wait()
                    await self._expire_sessions()
                for sid in list(self._sessions):
                    await self.close_session(sid)
                for kept, _ in self._kept.values():  # the node stops: nothing outlives it
                    await mgr.destroy(kept)
                self._kept.clear()
                for value in self.shared.values():
                    await _close(value)
        except BaseException as exc:
            self._start_error = exc
            raise
        finally:
            self._ready.set()

    async def _prune_orphans(self, mgr: SandboxManager) -> list[str]:
        """Remove this node's containers whose agent process is gone (an earlier incarnation
        that died with its node)."""
        removed = []
        for info in await mgr.provider.list({LABEL_NODE: self.name}):
            if info.labels.get(LABEL_AGENT) == self.incarnation or owner_alive(info.labels):
                continue
            try:
                await mgr.provider.remove(info.id)
                removed.append(info.id)
            except Exception as exc:
                log.warning("could not prune %s: %r", info.id, exc)
        if removed:
            log.warning("node %s: pruned %d sandboxes an earlier agent left", self.name, len(removed))
        return removed

    async def shutdown(self) -> None:
        """Close every session (destroying their sandboxes) and the manager."""
        if self._main_task is None:
            return
        self._stop.set()
        await asyncio.shield(self._main_task)

    async def info(self) -> dict[str, Any]:
        mgr = await self._started()
        return {
            "name": self.name,
            "incarnation": self.incarnation,
            "ray_node_id": self.ray_node_id,
            "pid": os.getpid(),
            "cap": self.cap,
            "live": mgr.live,
            "idle": mgr.idle,
            "waiting_creates": self.waiting_creates,
            "warm_pools": self.warm_pools(),
            "sessions": len(self._sessions),
            "kept": len(self._kept),
            "provider": mgr.provider.name,
            "pruned": list(self.pruned),
            "runs": self.runs,
            "manager_stats": dict(mgr.stats),
            "started_at": self.started_at,
        }

    async def ping(self) -> str:
        return self.incarnation

    # ---- sessions --------------------------------------------------------------------

    async def open_session(self, session_id: str, lease_s: float) -> dict[str, Any]:
        await self._started()
        sess = self._sessions.get(session_id)
        if sess is None:
            self._sessions[session_id] = _Session(session_id, lease_s)
        else:
            sess.lease_s, sess.last_seen = lease_s, time.monotonic()
        return await self.info()

    async def heartbeat(self, session_id: str) -> dict[str, Any]:
        self._session(session_id)  # renews its lease, or says it is gone
        mgr = await self._started()
        return {"live": mgr.live, "waiting_creates": self.waiting_creates}

    async def close_session(self, session_id: str) -> int:
        """End a session: cancel its work, destroy its sandboxes (keep the platform's), close
        what it stored. Returns how many sandboxes it held."""
        sess = self._sessions.pop(session_id, None)
        if sess is None:
            return 0
        for scope in list(sess.scopes):
            scope.cancel()
        n = len(sess.sandboxes)
        mgr = await self._started()
        with anyio.CancelScope(shield=True):
            for sid, sb in list(sess.sandboxes.items()):
                self._owner.pop(sid, None)
                labels = sess.labels.get(sid, {})
                if labels.get(LABEL_OWNER_KIND, OWNER_PROCESS) != OWNER_PROCESS:
                    self._kept[sid] = (sb, labels)  # for the next server on its state to adopt
                    continue
                await mgr.destroy(sb)
            for spec, _ in sess.warm.values():  # pools nobody asks for any more go
                await mgr.cool(spec, self._pool_wanted(spec))
            for value in sess.store.values():
                await _close(value)
        return n

    async def _expire_sessions(self) -> None:
        now = time.monotonic()
        for sess in list(self._sessions.values()):
            if now - sess.last_seen > sess.lease_s:
                log.warning("node %s: session %s missed its %.0fs lease; closing it", self.name, sess.id, sess.lease_s)
                await self.close_session(sess.id)
        if self._kept and now - self._kept_checked > KEPT_CHECK_S and self.mgr is not None:
            self._kept_checked = now
            for sid, (sb, _) in list(self._kept.items()):
                if not await sb.alive():  # its TTL ended it: free the slot
                    self._kept.pop(sid, None)
                    await self.mgr.destroy(sb)

    def _session(self, session_id: str) -> _Session:
        sess = self._sessions.get(session_id)
        if sess is None:
            raise SandboxGoneError(f"session {session_id} is unknown on node {self.name} (lease expired?)")
        sess.last_seen = time.monotonic()
        return sess

    # ---- sandboxes -------------------------------------------------------------------

    async def check(self, spec: SandboxSpec) -> None:
        mgr = await self._started()
        mgr.provider.check(spec)

    async def create(self, session_id: str, spec: SandboxSpec, labels: Mapping[str, str]) -> str:
        """Acquire a sandbox for the session; waits here while the node is at its cap."""
        mgr = await self._started()
        sess = self._session(session_id)
        self.waiting_creates += 1
        try:
            sb = await mgr.acquire(spec)
        finally:
            self.waiting_creates -= 1
        if session_id not in self._sessions:  # the session ended while we waited
            await mgr.destroy(sb)
            raise SandboxGoneError(f"session {session_id} ended")
        sess.sandboxes[sb.id] = sb
        sess.labels[sb.id] = dict(labels)
        self._owner[sb.id] = session_id
        return sb.id

    async def adopt(self, session_id: str, sandbox_id: str) -> bool:
        """Move a running sandbox of this node into the session: one kept after its session
        ended, or one still in the session of a client that went away (a server restarted
        before its old session's lease ran out). False when the node has no such sandbox."""
        sess = self._session(session_id)
        old = self._sessions.get(self._owner.get(sandbox_id, ""))
        if old is not None and sandbox_id in old.sandboxes:
            sb, labels = old.sandboxes.pop(sandbox_id), old.labels.pop(sandbox_id, {})
        elif sandbox_id in self._kept:
            sb, labels = self._kept.pop(sandbox_id)
        else:
            return False
        if not await sb.alive():
            self._owner.pop(sandbox_id, None)
            if self.mgr is not None:
                await self.mgr.destroy(sb)
            return False
        sess.sandboxes[sandbox_id] = sb
        sess.labels[sandbox_id] = labels
        self._owner[sandbox_id] = session_id
        return True

    def _sandbox(self, sandbox_id: str) -> ManagedSandbox:
        sid = self._owner.get(sandbox_id)
        sess = self._sessions.get(sid) if sid else None
        sb = sess.sandboxes.get(sandbox_id) if sess else None
        if sb is None:
            raise SandboxGoneError(f"sandbox {sandbox_id} is not on node {self.name} (destroyed?)")
        assert sess is not None
        sess.last_seen = time.monotonic()
        return sb

    async def destroy(self, sandbox_id: str) -> None:
        kept = self._kept.pop(sandbox_id, None)
        if kept is not None and self.mgr is not None:
            await self.mgr.destroy(kept[0])
            return
        sid = self._owner.pop(sandbox_id, None)
        sess = self._sessions.get(sid) if sid else None
        if sess is None:
            return
        sb = sess.sandboxes.pop(sandbox_id, None)
        sess.labels.pop(sandbox_id, None)
        if sb is not None and self.mgr is not None:
            await self.mgr.destroy(sb)

    async def exec(
        self,
        sandbox_id: str,
        cmd: Command,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        return await self._sandbox(sandbox_id).exec(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin)

    async def exec_many(self, sandbox_id: str, jobs: Sequence[ExecJob], parallel: int | None = None) -> list[ExecResult]:
        return await self._sandbox(sandbox_id).exec_many(jobs, parallel=parallel)

    async def write_file(self, sandbox_id: str, path: str, data: bytes | str, mode: int = 0o644) -> None:
        await self._sandbox(sandbox_id).write_file(path, data, mode)

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        return await self._sandbox(sandbox_id).read_file(path)

    async def put_archive(self, sandbox_id: str, dest_dir: str, tar_bytes: bytes) -> None:
        await self._sandbox(sandbox_id).put_archive(dest_dir, tar_bytes)

    async def get_archive(self, sandbox_id: str, path: str) -> bytes:
        return await self._sandbox(sandbox_id).get_archive(path)

    async def reset(self, sandbox_id: str) -> bool:
        return await self._sandbox(sandbox_id).reset()

    async def alive(self, sandbox_id: str) -> bool:
        try:
            return await self._sandbox(sandbox_id).alive()
        except SandboxGoneError:
            return False

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        """This node's sandboxes; one made for a client shows that client's labels."""
        mgr = await self._started()
        out = []
        for info in await mgr.provider.list({LABEL_NODE: self.name}):
            sid = self._owner.get(info.id)
            sess = self._sessions.get(sid) if sid else None
            client = sess.labels.get(info.id, {}) if sess else self._kept.get(info.id, (None, {}))[1]
            shown = {**info.labels, **client}
            if labels and any(shown.get(k) != v for k, v in labels.items()):
                continue
            out.append(info.model_copy(update={"labels": shown}))
        return out

    async def remove(self, sandbox_id: str) -> bool:
        """Remove a sandbox of this node, whoever made it; False when it is not this node's."""
        if sandbox_id in self._owner or sandbox_id in self._kept:
            await self.destroy(sandbox_id)
            return True
        mgr = await self._started()
        if any(i.id == sandbox_id for i in await mgr.provider.list({LABEL_NODE: self.name})):
            await mgr.provider.remove(sandbox_id)
            return True
        return False

    # ---- warm pools ------------------------------------------------------------------

    def warm_pools(self) -> dict[str, int]:
        """Spec key -> the warm pool this node keeps for it (what its sessions asked for)."""
        specs = {key: spec for s in self._sessions.values() for key, (spec, _) in s.warm.items()}
        return {key: self._pool_wanted(spec) for key, spec in specs.items()}

    def _pool_wanted(self, spec: SandboxSpec) -> int:
        """The warm pool a spec gets: the most any open session asked for."""
        return max((s.warm[spec.key()][1] for s in self._sessions.values() if spec.key() in s.warm), default=0)

    async def warm(self, session_id: str, spec: SandboxSpec, n: int) -> None:
        """Keep `n` sandboxes of `spec` ready while the session lasts (made in the background)."""
        mgr = await self._started()
        self._session(session_id).warm[spec.key()] = (spec, min(n, self.cap))
        await mgr.warm(spec, self._pool_wanted(spec), wait=False)

    # ---- work next to the sandboxes -------------------------------------------------

    async def run(self, session_id: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """`await fn(ctx, *args)` here, a `RunContext` giving the node's manager and caches;
        cancelled if the session ends (lease expired, closed) while it runs."""
        mgr = await self._started()
        sess = self._session(session_id)
        ctx = RunContext(self, sess, mgr)
        self.runs += 1
        with anyio.CancelScope() as scope:
            sess.scopes.add(scope)
            try:
                return await fn(ctx, *args)
            finally:
                sess.scopes.discard(scope)
        raise SandboxLostError(f"session {session_id} ended on node {self.name} while its work ran")


class RunContext:
    """What a function run by `NodeAgent.run` sees of the node."""

    def __init__(self, agent: NodeAgent, session: _Session, manager: SandboxManager) -> None:
        self._agent = agent
        self._session = session
        self.manager = manager  # the node's: its hard cap covers this work's sandboxes too
        self.node = agent.name
        self.shared = agent.shared  # kept for every session; values with close()/aclose() are closed at shutdown
        self.shared_lock = agent.shared_lock
        self.store = session.store  # kept for this session; closed with it

    async def warm(self, spec: SandboxSpec, n: int) -> None:
        """Keep `n` sandboxes of `spec` ready on this node while the session lasts."""
        await self._agent.warm(self._session.id, spec, n)


async def _close(value: Any) -> None:
    for name in ("aclose", "close"):
        fn = getattr(value, name, None)
        if fn is not None:
            try:
                res = fn()
                if hasattr(res, "__await__"):
                    await res
            except Exception as exc:
                log.warning("closing %r failed: %r", value, exc)
            return
