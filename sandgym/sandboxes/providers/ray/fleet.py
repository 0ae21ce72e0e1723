"""The fleet: a driver's view of the sandgym nodes of a Ray cluster.

- Discovery: Ray nodes advertising `sandgym_node:<name>` (cluster.py); each gets its node
  agent (agent.py), a named detached actor shared by every driver of the cluster, created
  on first use with an explicit `max_concurrency`.
- Placement: a create goes to the node with the lowest share of its limit in use (the
  agent's hard cap, lowered by `max_per_node`), among nodes not backing off; when every
  node is full or the cluster-wide cap `max_sandboxes` is reached, the create waits until
  a sandbox is released, then proceeds. Creates are spaced by a token bucket
  (`create_rate`, `create_burst`); a node whose create fails backs off exponentially and
  the create is tried on another node (`create_attempts` in all).
- Exec goes straight to the owning node's agent (`RaySandbox`, sandbox.py).
- Failure: a monitor polls Ray's node table every `monitor_interval_s`; a node that Ray
  reports dead, or whose agent died under a call, is *lost*: calls in flight to it end at
  once with `SandboxLostError` (a typed infrastructure error, classified "sandbox"), its
  sandboxes are reported lost, its slots freed. A node that comes back (the same name on a
  new Ray node) gets a new agent, which prunes the containers the dead one left. Nothing
  waits on a dead node: every wait is woken by the monitor or bounded (`node_wait_s`).
- Sessions: the fleet renews its session on every agent (`lease_s`); if this driver dies,
  agents destroy its sandboxes once the lease runs out -- but keep those made with the
  label `sandgym.owner_kind=platform` (a `sandgym serve --ray` with state), which the next
  server's fleet `adopt`s.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ...errors import SandboxCreateError, SandboxError, SandboxGoneError, SandboxLostError, SpecError
from ...result import SandboxInfo
from ...spec import SandboxSpec
from .cluster import NAMESPACE, NODE_RESOURCE_PREFIX, agent_name, connect, node_name_of
from .ratelimit import Backoff, TokenBucket
from .sandbox import RaySandbox

log = logging.getLogger(__name__)

# Ray queues calls past an actor's max_concurrency without a word (default 1000 for async
# actors). Agents get an explicit limit; drivers check their fan-in against it.
AGENT_MAX_CONCURRENCY = 10_000


def agent_runtime_env() -> dict[str, Any]:
    """Agents run the driver's sandgym: from a source checkout (not an installed package),
    that checkout goes first on the agent's PYTHONPATH. Where the path does not exist (another
    machine), the installed sandgym is used."""
    import sandgym

    root = Path(sandgym.__file__).resolve().parent.parent
    if root.name in ("site-packages", "dist-packages"):
        return {}
    return {"env_vars": {"PYTHONPATH": f"{root}{os.pathsep}${{PYTHONPATH}}"}}


_AGENT_CLASS: Any = None


def agent_class() -> Any:
    global _AGENT_CLASS
    if _AGENT_CLASS is None:
        import ray

        from .agent import NodeAgent

        _AGENT_CLASS = ray.remote(NodeAgent)
    return _AGENT_CLASS


@dataclass(eq=False)
class FleetNode:
    """One sandgym node as this fleet sees it."""

    name: str
    ray_node_id: str
    state: str = "starting"  # starting -> ready -> lost
    agent: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    cap: int = 0  # the agent's hard cap (all clients)
    limit: int = 0  # this fleet's share: min(cap, max_per_node)
    held: set[str] = field(default_factory=set)  # this fleet's sandboxes there (+ creates in flight)
    reported: dict[str, Any] = field(default_factory=dict)  # the agent's last load report
    backoff: Backoff = field(default_factory=Backoff)
    lost_event: asyncio.Event = field(default_factory=asyncio.Event)
    lost_reason: str = ""
    lost_at: float | None = None
    joined_at: float = field(default_factory=time.time)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def load(self) -> tuple[float, int, int, str]:
        return (len(self.held) / max(1, self.limit), int(self.reported.get("waiting_creates", 0)), len(self.held), self.name)


class Fleet:
    def __init__(
        self,
        address: str | None = None,
        *,
        max_sandboxes: int | None = None,
        max_per_node: int | None = None,
        nodes: Iterable[str] | None = None,
        create_rate: float = 50.0,
        create_burst: float | None = None,
        create_attempts: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        monitor_interval_s: float = 0.5,
        lease_s: float = 60.0,
        node_wait_s: float = 120.0,
        agent_provider: str = "docker",
        agent_provider_options: Mapping[str, Any] | None = None,
        agent_max_sandboxes: int | None = None,
    ) -> None:
        """`max_sandboxes`: cluster-wide cap for this fleet (None: the nodes' limits only).
        `max_per_node`: this fleet's limit per node (never above the agent's hard cap).
        `nodes`: only these node names. `agent_*`: how an agent is made where none runs
        yet (its provider; its cap when the node advertises none)."""
        if max_sandboxes is not None and max_sandboxes < 1:
            raise ValueError(f"max_sandboxes must be >= 1, got {max_sandboxes}")
        if max_per_node is not None and max_per_node < 1:
            raise ValueError(f"max_per_node must be >= 1, got {max_per_node}")
        if create_attempts < 1:
            raise ValueError(f"create_attempts must be >= 1, got {create_attempts}")
        self.address = address
        self.max_sandboxes = max_sandboxes
        self.max_per_node = max_per_node
        self.only = set(nodes) if nodes is not None else None
        self.rate = TokenBucket(create_rate, create_burst)
        self.create_attempts = create_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.monitor_interval_s = monitor_interval_s
        self.lease_s = lease_s
        self.node_wait_s = node_wait_s
        self.agent_provider = agent_provider
        self.agent_provider_options = dict(agent_provider_options or {})
        self.agent_max_sandboxes = agent_max_sandboxes
        self.session = f"fleet-{uuid.uuid4().hex[:12]}"
        self.created_at = time.time()
        self.nodes: dict[str, FleetNode] = {}
        self.events: list[dict[str, Any]] = []  # node joined / lost, with times
        self.stats = {"created": 0, "create_failures": 0, "create_waits": 0, "lost_sandboxes": 0, "destroyed": 0}
        self.waiting = 0  # creates waiting for capacity right now
        self.on_join: list[Callable[[FleetNode], Awaitable[None]]] = []
        self.on_lost: list[Callable[[FleetNode], None]] = []
        self._where: dict[str, FleetNode] = {}  # sandbox id -> node
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._monitor: asyncio.Task[None] | None = None
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._last_heartbeat = 0.0

    # ---- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, *, min_nodes: int = 1) -> None:
        """Connect, start the agents, and wait (up to `node_wait_s`) for `min_nodes` and for
        every node seen at the start to be ready (or lost)."""
        async with self._start_lock:
            if self._closed:
                raise RuntimeError("fleet is closed")
            if not self._started:
                connect(self.address)
                await self._refresh()
                self._monitor = asyncio.get_running_loop().create_task(self._monitor_loop())
                self._started = True
        await self.wait_for_nodes(min_nodes)
        deadline = time.monotonic() + self.node_wait_s
        while any(n.state == "starting" for n in self.nodes.values()) and time.monotonic() < deadline:
            await self.wait_change(0.5)

    async def wait_for_nodes(self, n: int = 1, timeout: float | None = None) -> list[FleetNode]:
        deadline = time.monotonic() + (self.node_wait_s if timeout is None else timeout)
        while len(self.ready_nodes()) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                seen = {k: v.state for k, v in self.nodes.items()}
                raise SandboxCreateError(
                    f"{len(self.ready_nodes())} sandgym node(s) ready, wanted {n} (seen: {seen or 'none'}); "
                    f"a node advertises the Ray resource '{NODE_RESOURCE_PREFIX}<name>'"
                )
            await self.wait_change(min(left, 1.0))
        return self.ready_nodes()

    async def close(self) -> None:
        """End this fleet's session on every agent (they destroy its sandboxes)."""
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._monitor.cancel()
        for t in list(self._tasks):
            t.cancel()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for node in self.ready_nodes():
                    tg.start_soon(self._close_session, node)
        self.notify()

    async def _close_session(self, node: FleetNode) -> None:
        try:
            with anyio.fail_after(30):
                await self.call(node, "close_session", self.session)
        except Exception as exc:  # a lost node's sandboxes are its returning agent's to prune
            log.warning("closing the session on node %s failed: %r", node.name, exc)

    def ready_nodes(self) -> list[FleetNode]:
        return sorted((n for n in self.nodes.values() if n.ready), key=lambda n: n.name)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._changed.wait()

    # ---- discovery and failure detection ---------------------------------------------

    async def _monitor_loop(self) -> None:
        while True:
            await anyio.sleep(self.monitor_interval_s)
            try:
                await self._refresh()
                if time.monotonic() - self._last_heartbeat > self.lease_s / 4:
                    self._last_heartbeat = time.monotonic()
                    for node in self.ready_nodes():
                        self._spawn(self._heartbeat(node))
            except Exception as exc:  # the monitor must outlive a bad tick
                log.warning("fleet monitor tick failed: %r", exc)

    async def _refresh(self) -> None:
        import ray

        rows = await anyio.to_thread.run_sync(ray.nodes)
        alive: dict[str, str] = {}
        for row in rows:
            name = node_name_of(row.get("Resources") or {})
            if name is None or not row.get("Alive") or (self.only is not None and name not in self.only):
                continue
            alive.setdefault(name, row["NodeID"])
        for name, node in list(self.nodes.items()):
            if node.state != "lost" and alive.get(name) != node.ray_node_id:
                self._lose(node, "Ray reports the node dead")
        for name, ray_id in alive.items():
            known = self.nodes.get(name)
            if known is None or known.state == "lost":
                # New, or back (a new Ray node with the same name, or the same one whose
                # agent died under a call): start (or find) its agent.
                node = self.nodes[name] = FleetNode(name, ray_id, backoff=Backoff(self.backoff_s, self.max_backoff_s))
                self._spawn(self._attach(node))

    async def _attach(self, node: FleetNode) -> None:
        """Get or create the node's agent and open this fleet's session there."""
        import ray

        deadline = time.monotonic() + self.node_wait_s
        while node.state == "starting" and not self._closed:
            handle = agent_class().options(
                name=agent_name(node.name),
                namespace=NAMESPACE,
                get_if_exists=True,
                lifetime="detached",
                resources={NODE_RESOURCE_PREFIX + node.name: 1},
                num_cpus=0,
                max_concurrency=AGENT_MAX_CONCURRENCY,
                max_restarts=0,
                runtime_env=agent_runtime_env(),
            ).remote(node.name, self.agent_max_sandboxes, self.agent_provider, self.agent_provider_options)
            try:
                with anyio.fail_after(max(1.0, deadline - time.monotonic())):
                    info = await handle.open_session.remote(self.session, self.lease_s)
            except ray.exceptions.RayActorError as exc:
                # The name still points at the agent of a node that died (Ray frees it
                # once it has noticed): try again shortly.
                log.info("agent of node %s not usable yet: %s", node.name, exc)
                await anyio.sleep(0.5)
                continue
            except TimeoutError:
                self._lose(node, f"its agent did not start within {self.node_wait_s:.0f}s")
                return
            except Exception as exc:
                self._lose(node, f"its agent failed to start: {exc!r}")
                return
            if info["ray_node_id"] != node.ray_node_id:
                await anyio.sleep(0.5)  # an agent on another Ray node (the old one): stale
                continue
            if node.state != "starting":
                return
            node.agent, node.info = handle, info
            node.cap = int(info["cap"])
            node.limit = min(node.cap, self.max_per_node or node.cap)
            node.state = "ready"
            node.joined_at = time.time()
            # What the agent pruned at its start counts here only if it started for this fleet.
            pruned = len(info["pruned"]) if info["started_at"] >= self.created_at else 0
            self.events.append({"event": "joined", "node": node.name, "time": node.joined_at, "pruned": pruned,
                                "agent_started_at": info["started_at"]})
            log.info("node %s ready (cap %d, pruned %d)", node.name, node.cap, pruned)
            self.notify()
            for hook in self.on_join:
                self._spawn(hook(node))

    async def _heartbeat(self, node: FleetNode) -> None:
        try:
            with anyio.fail_after(max(5.0, self.lease_s / 2)):
                node.reported = await self.call(node, "heartbeat", self.session)
        except SandboxLostError:
            pass
        except Exception as exc:
            log.warning("heartbeat to node %s failed: %r", node.name, exc)

    def _lose(self, node: FleetNode, reason: str) -> None:
        if node.state == "lost":
            return
        was_ready = node.ready
        node.state = "lost"
        node.lost_reason = reason
        node.lost_at = time.time()
        node.lost_event.set()  # every call in flight to it ends now
        lost = [sid for sid in node.held if sid in self._where]
        self.stats["lost_sandboxes"] += len(lost)
        for sid in lost:
            self._where.pop(sid, None)
        node.held.clear()
        if was_ready:
            self.events.append({"event": "lost", "node": node.name, "time": node.lost_at, "reason": reason, "sandboxes": len(lost)})
            log.warning("node %s lost (%s): %d sandboxes with it", node.name, reason, len(lost))
            for hook in self.on_lost:
                hook(node)
        self.notify()

    # ---- calls -----------------------------------------------------------------------

    async def call(self, node: FleetNode, method: str, *args: Any) -> Any:
        """`node`'s agent `method(*args)`. Raises SandboxLostError when the node is lost
        before or while the call runs; an error raised by the agent comes back as itself."""
        import ray

        if node.state == "lost":
            raise SandboxLostError(f"node {node.name} was lost ({node.lost_reason})")
        ref = getattr(node.agent, method).remote(*args)
        result = asyncio.ensure_future(ref)
        lost = asyncio.ensure_future(node.lost_event.wait())
        try:
            await asyncio.wait({result, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not result.done():
                result.cancel()
        if not result.done() or result.cancelled():
            raise SandboxLostError(f"node {node.name} was lost ({node.lost_reason}) during {method}")
        try:
            return result.result()
        except ray.exceptions.RayActorError as exc:
            self._lose(node, f"its agent died: {type(exc).__name__}")
            raise SandboxLostError(f"node {node.name} was lost during {method}: {type(exc).__name__}") from exc
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    def node_of(self, sandbox_id: str) -> FleetNode | None:
        return self._where.get(sandbox_id)

    # ---- placement -------------------------------------------------------------------

    def _total_held(self) -> int:
        return sum(len(n.held) for n in self.nodes.values())

    def _pick(self, avoid: set[str]) -> FleetNode | None:
        if self.max_sandboxes is not None and self._total_held() >= self.max_sandboxes:
            return None
        free = [n for n in self.ready_nodes() if len(n.held) < n.limit and n.backoff.remaining() == 0]
        preferred = [n for n in free if n.name not in avoid] or free
        return min(preferred, key=FleetNode.load) if preferred else None

    async def _reserve(self, avoid: set[str]) -> tuple[FleetNode, str]:
        """A slot on the best node with room, waiting for one (bounded when no node is up)."""
        await self.start()
        no_nodes_since: float | None = None
        counted = False
        while True:
            if self._closed:
                raise SandboxCreateError("fleet is closed")
            node = self._pick(avoid)
            if node is not None:
                token = f"pending-{uuid.uuid4().hex}"
                node.held.add(token)
                return node, token
            if not any(n.state in ("ready", "starting") for n in self.nodes.values()):
                no_nodes_since = no_nodes_since or time.monotonic()
                if time.monotonic() - no_nodes_since > self.node_wait_s:
                    raise SandboxCreateError(f"no sandgym node up for {self.node_wait_s:.0f}s")
            else:
                no_nodes_since = None
            if not counted:
                self.stats["create_waits"] += 1
                counted = True
            backoffs = [n.backoff.remaining() for n in self.ready_nodes() if n.backoff.remaining() > 0]
            self.waiting += 1
            try:
                await self.wait_change(min(backoffs + [1.0]))
            finally:
                self.waiting -= 1

    def _unreserve(self, node: FleetNode, token: str) -> None:
        node.held.discard(token)
        self.notify()

    async def create(self, spec: SandboxSpec, labels: Mapping[str, str]) -> Any:
        """A sandbox on the node with most room; see the module docstring."""
        tried: set[str] = set()
        last: BaseException | None = None
        for _ in range(self.create_attempts):
            node, token = await self._reserve(tried)
            try:
                await self.rate.acquire()
                sid = await self.call(node, "create", self.session, spec, dict(labels))
            except SpecError:
                self._unreserve(node, token)
                raise
            except BaseException as exc:
                self._unreserve(node, token)
                if not isinstance(exc, Exception):
                    raise
                last = exc
                tried.add(node.name)
                self.stats["create_failures"] += 1
                if not isinstance(exc, SandboxLostError):
                    delay = node.backoff.fail()
                    log.warning("create on node %s failed (%r); backing off %.1fs", node.name, exc, delay)
                continue
            node.backoff.succeed()
            if node.state == "lost":  # lost while the create came back
                last = SandboxLostError(f"node {node.name} was lost")
                continue
            node.held.discard(token)
            node.held.add(sid)
            self._where[sid] = node
            self.stats["created"] += 1
            return RaySandbox(self, node, sid, spec)
        raise SandboxCreateError(f"could not create a sandbox in {self.create_attempts} attempts: {last!r}") from last

    async def warm(self, spec: SandboxSpec, per_node: int) -> None:
        """Keep `per_node` sandboxes of `spec` ready on every node (its agent's warm pool,
        while this fleet's session lasts): a create there is then a pool hit."""
        await self.start()
        async with anyio.create_task_group() as tg:
            for node in self.ready_nodes():
                tg.start_soon(self.call, node, "warm", self.session, spec, min(per_node, node.limit))

    async def adopt(self, sandbox_id: str, spec: SandboxSpec) -> Any:
        """A running sandbox made by an earlier client (a platform server before its
        restart), moved into this fleet's session on whichever node holds it.
        SandboxGoneError when no node does."""
        await self.start()
        for node in self.ready_nodes():
            try:
                found = await self.call(node, "adopt", self.session, sandbox_id)
            except SandboxError as exc:
                log.warning("adopt on node %s failed: %r", node.name, exc)
                continue
            if found:
                node.held.add(sandbox_id)
                self._where[sandbox_id] = node
                self.notify()
                return RaySandbox(self, node, sandbox_id, spec)
        raise SandboxGoneError(f"sandbox {sandbox_id} is running on no sandgym node", reason="LOST")

    def forget(self, sandbox_id: str) -> None:
        """Stop tracking a sandbox without destroying it (its client detached from it)."""
        node = self._where.pop(sandbox_id, None)
        if node is not None:
            node.held.discard(sandbox_id)
            self.notify()

    async def destroy(self, sandbox_id: str) -> None:
        node = self._where.pop(sandbox_id, None)
        if node is None:
            return
        try:
            await self.call(node, "destroy", sandbox_id)
        except SandboxLostError:
            pass  # gone with its node; the node's next agent prunes the container
        finally:
            node.held.discard(sandbox_id)
            self.stats["destroyed"] += 1
            self.notify()

    # ---- listing ---------------------------------------------------------------------

    async def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        await self.start()
        out: list[SandboxInfo] = []

        async def one(node: FleetNode) -> None:
            try:
                rows = await self.call(node, "list", dict(labels) if labels else None)
            except SandboxError as exc:
                log.warning("listing node %s failed: %r", node.name, exc)
                return
            out.extend(r.model_copy(update={"provider": "ray"}) for r in rows)

        async with anyio.create_task_group() as tg:
            for node in self.ready_nodes():
                tg.start_soon(one, node)
        return out

    async def remove(self, sandbox_id: str) -> None:
        if sandbox_id in self._where:
            await self.destroy(sandbox_id)
            return
        await self.start()
        for node in self.ready_nodes():
            try:
                if await self.call(node, "remove", sandbox_id):
                    return
            except SandboxError as exc:
                log.warning("remove on node %s failed: %r", node.name, exc)

    # ---- status ----------------------------------------------------------------------

    def status(self) -> builtins.list[dict[str, Any]]:  # `list`: the method above
        return [
            {
                "node": n.name,
                "state": n.state,
                "cap": n.cap,
                "limit": n.limit,
                "held": len(n.held),
                "backoff_s": round(n.backoff.remaining(), 3),
                "lost_reason": n.lost_reason or None,
            }
            for n in sorted(self.nodes.values(), key=lambda n: n.name)
        ]

    def per_node_share(self, total: int) -> int:
        """`total` spread over the ready nodes (at least 1 each)."""
        return max(1, math.ceil(total / max(1, len(self.ready_nodes()))))
