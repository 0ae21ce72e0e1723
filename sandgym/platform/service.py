"""The platform's state machine: records, the SandboxManager behind them, fair admission
(PENDING -> PROVISIONING -> RUNNING | ERROR), deletion (-> TERMINATED), TTL and idle reaping,
sandboxes that die (-> ERROR with an error type), and restarts (state in SQLite).

Restarts. With a state directory every record is a row written before its container exists;
containers carry `platform.id` (the row), `platform.state` (the state directory) and
`platform.instance`. Leaving the server detaches from its sandboxes (they keep running, their
rows stay live, their live processes run on); the next server on the same state directory
(after a clean stop, a crash or a re-exec alike) re-adopts every container that still runs
(its egress plumbing made again, a policy changed since applied, its live processes
re-attached), marks RUNNING rows whose container vanished ERROR (`SANDBOX_LOST`), makes again
the creates that had not reached RUNNING (a container half-made by a killed server is removed
first), and removes containers of its state that no live row claims.

Admission. The host has `max_sandboxes` slots for all tenants. A create past the token's
quota answers 429; a create that fits the quota but finds the host full waits PENDING with a
`waiting_reason`, and each freed slot goes to the waiting tenant holding the fewest slots
(ties: the longest waiting), so one tenant cannot starve another.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import anyio.from_thread
from anyio.abc import TaskGroup
from pydantic import ValidationError

from sandgym.sandboxes.base import AdoptingProvider, Provider
from sandgym.sandboxes.errors import ImagePullError, SpecError
from sandgym.sandboxes.live import LiveHandle
from sandgym.sandboxes.manager import SandboxManager
from sandgym.sandboxes.registry import provider_options
from sandgym.sandboxes.spec import SandboxSpec

from .db import StateDB, StateWriteError
from .egress import WirePolicy
from .models import MIN_MEMORY_MB, CreateSandboxBody, GatewayAuth
from .sessions import Session, SessionTable
from .store import LIVE, Egress, Record, Store, token_hash

log = logging.getLogger(__name__)

# Labels on every platform container (the reaper's contract: see docs/design-notes.md).
LABEL_ID = "platform.id"
LABEL_TENANT = "platform.tenant"
LABEL_STATE = "platform.state"
LABEL_INSTANCE = "platform.instance"
LABEL_OWNER_KIND = "sandgym.owner_kind"

# The sandbox layer's reasons for a death (result.ErrorType) -> the platform's error types
# (OOM_KILLED and TIMEOUT are Prime's own; the SDK raises SandboxOOMError / SandboxTimeoutError).
DEATHS = {
    "OOM_KILLED": "OOM_KILLED",
    "TIMEOUT": "TIMEOUT",
    "EXITED": "SANDBOX_EXITED",
    "REMOVED": "SANDBOX_REMOVED",
    "LOST": "SANDBOX_LOST",
    "DISK_FULL": "DISK_FULL",
}

# SandboxSpec field -> the prime request field it comes from (to name fields in 422s).
SPEC_TO_PRIME = {
    "image": "docker_image",
    "cpu": "cpu_cores",
    "memory_mb": "memory_gb",
    "disk_mb": "disk_size_gb",
    "gpus": "gpu_count",
    "env": "environment_vars",
    "ttl_s": "timeout_minutes",
    "labels": "labels",
    "egress": "network_allowlist",
}


class EgressUnavailable(Exception):
    """This sandbox cannot change its network (made without egress plumbing)."""


class InvalidRequest(Exception):
    """A create request this server cannot honour; `errors` is FastAPI's 422 detail shape."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors


def spec_error_field(exc: SpecError) -> str:
    """The SandboxSpec field a provider's SpecError names (they start `field:` or `field=`)."""
    m = re.match(r"^\s*(\w+)\s*[:=]", str(exc))
    return m.group(1) if m else ""


def _field_error(field_name: str, msg: str) -> dict[str, Any]:
    return {"type": "value_error", "loc": ["body", field_name], "msg": msg}


@dataclass
class ServerConfig:
    tokens: list[str]
    provider: str | Provider = "docker"
    max_sandboxes: int = 8
    quota: int | None = None  # live sandboxes per token; default: see default_quota
    quotas: dict[str, int] = field(default_factory=dict)  # token -> its own quota
    max_ttl_s: float = 24 * 3600.0
    idle_timeout_s: float | None = 3600.0  # None: only explicit idle_timeout_minutes reap
    gateway_token_ttl_s: float = 3600.0
    output_limit_bytes: int = 16 << 20
    max_exec_timeout_s: float = 24 * 3600.0
    retain_ended_s: float = 3600.0
    reap_interval_s: float = 2.0
    status_wait_s: float = 1.0  # batch status long-polls PENDING sandboxes this long
    public_url: str | None = None  # base URL clients reach the gateway at; default: request's
    provider_options: dict[str, Any] = field(default_factory=dict)
    # Persistence: None keeps state in memory and destroys every sandbox at exit.
    state_dir: str | None = None
    shutdown_sandboxes: bool = False  # with a state_dir: destroy (not detach) at exit
    # What a create without network fields gets (None: no network); a profile for all.
    egress_default: list[str] | None = None
    profile: Literal["strict", "vm"] | None = None  # None: the sandbox layer's default
    image_pull: Literal["missing", "never", "always"] | None = None
    max_body_bytes: int = 16 << 20  # control plane and Connect requests (413 past it)
    max_upload_bytes: int = 256 << 20  # gateway file uploads
    drain_s: float = 20.0  # a stop or re-exec waits this long for in-flight work (runner.py)

    def __post_init__(self) -> None:
        # A misspelt provider option is refused by name here, before anything starts.
        if isinstance(self.provider, str):
            self.provider_options = provider_options(self.provider, self.provider_options)

    def default_quota(self) -> int:
        """Below the host cap as soon as two tokens share it, so one tenant never fills it."""
        if self.quota is not None:
            return self.quota
        return self.max_sandboxes if len(self.tokens) <= 1 else max(1, self.max_sandboxes // 2)


class Admission:
    """Fair admission to the host's slots: per-tenant FIFO queues, the next slot to the
    waiting tenant holding the fewest."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.held: dict[str, int] = {}
        self.queues: dict[str, deque[Record]] = {}
        self._seq = 0
        self._since: dict[str, int] = {}  # record id -> enqueue order

    @property
    def used(self) -> int:
        return sum(self.held.values())

    def take(self, tenant: str) -> None:
        self.held[tenant] = self.held.get(tenant, 0) + 1

    def give(self, tenant: str) -> None:
        self.held[tenant] = max(0, self.held.get(tenant, 0) - 1)

    def enqueue(self, rec: Record) -> None:
        self._seq += 1
        self._since[rec.id] = self._seq
        self.queues.setdefault(rec.tenant, deque()).append(rec)

    def drop(self, rec: Record) -> bool:
        q = self.queues.get(rec.tenant)
        if q is not None and rec in q:
            q.remove(rec)
            self._since.pop(rec.id, None)
            return True
        return False

    def next(self) -> Record | None:
        """The record to admit now (its slot taken), or None (host full or nobody waits)."""
        if self.used >= self.slots:
            return None
        waiting = [(self.held.get(t, 0), self._since[q[0].id], t) for t, q in self.queues.items() if q]
        if not waiting:
            return None
        _, _, tenant = min(waiting)
        rec = self.queues[tenant].popleft()
        self._since.pop(rec.id, None)
        self.take(tenant)
        return rec

    def waiting(self) -> list[Record]:
        """Everyone waiting, in the order they would be admitted if nothing changed."""
        held = dict(self.held)
        queues = {t: list(q) for t, q in self.queues.items() if q}
        order: list[Record] = []
        while queues:
            _, _, t = min((held.get(t, 0), self._since[q[0].id], t) for t, q in queues.items())
            order.append(queues[t].pop(0))
            held[t] = held.get(t, 0) + 1
            if not queues[t]:
                del queues[t]
        return order


class Service:
    def __init__(self, config: ServerConfig) -> None:
        from .auth import tenant_of

        self.config = config
        self.db = StateDB(config.state_dir)
        quotas = {tenant_of(t): q for t, q in config.quotas.items()}
        self.store = Store(self.db, quota=config.default_quota(), quotas=quotas, retain_s=config.retain_ended_s)
        options = dict(config.provider_options)
        if config.provider == "docker":
            options.setdefault("pull_progress", self._on_pull)  # shown as the waiting reason
        self.manager = SandboxManager(
            config.provider,
            max_sandboxes=config.max_sandboxes,
            create_retries=0,
            provider_options=options or None,
            run_id=self.db.instance_id if self.db.persistent else None,
        )
        if self.db.persistent:
            # The reapers' contract (branch i19-reap, ownership.py): a platform sandbox outlives
            # the process that made it; no host reaper, owner lifeline or `prune` ends it.
            # (With that branch merged: SandboxManager(owner_kind="platform").)
            self.manager.labels[LABEL_OWNER_KIND] = "platform"
        self.admission = Admission(config.max_sandboxes)
        self.default_policy = WirePolicy.parse(config.egress_default, None) if config.egress_default is not None else WirePolicy.blocked()
        self._tg: TaskGroup | None = None
        self.stopping = False
        self.draining = False
        self._drain_until = 0.0
        self.started_mono = time.monotonic()
        self.counters = {"created": 0, "create_errors": 0, "deleted": 0, "reaped": 0, "execs": 0, "died": 0, "adopted": 0}

    # ---- lifecycle ---------------------------------------------------------------------

    @property
    def detaching(self) -> bool:
        """Leaving keeps the sandboxes running for the next server on this state."""
        return self.db.persistent and not self.config.shutdown_sandboxes

    def platform_labels(self, record_id: str, tenant: str) -> dict[str, str]:
        labels = {LABEL_ID: record_id, LABEL_TENANT: tenant}
        if self.db.persistent:
            labels[LABEL_STATE] = str(self.db.state_dir)
            labels[LABEL_INSTANCE] = self.db.instance_id
        return labels

    async def __aenter__(self) -> Service:
        await self.manager.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._recover()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        self._tg.start_soon(self._reaper)
        return self

    async def __aexit__(self, *exc: object) -> None:
        drain_egress = getattr(self.manager.provider, "drain_egress", None)
        if self.draining and self.detaching and drain_egress is not None:
            # Requests are done; downloads the sandboxes have under way finish too (the rest
            # of the drain's bound, at least a second) before the egress path goes.
            try:
                busy = await drain_egress(max(1.0, self._drain_until - time.monotonic()))
                if busy:
                    log.warning("egress: %d transfers still running at the end of the drain are cut", busy)
            except Exception as exc:
                log.warning("draining egress failed: %r", exc)
        self.stopping = True
        try:
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
                await self._tg.__aexit__(None, None, None)
        finally:
            try:
                with anyio.CancelScope(shield=True):
                    await self._leave()
            finally:
                try:
                    await self.manager.__aexit__(None, None, None)
                finally:
                    self.db.close()

    def begin_drain(self) -> None:
        """The server stopped accepting and waits for in-flight requests: end the streams of
        live processes now (they would hold the drain to its bound); their clients re-attach
        to the next server on this state."""
        self.draining = True
        self._drain_until = time.monotonic() + self.config.drain_s
        for rec in self.store.all():
            if rec.sessions is not None:
                rec.sessions.detach_all()

    async def _leave(self) -> None:
        for rec in self.store.all():
            kept = self.detaching and rec.sandbox is not None and not rec.ended
            if rec.sessions is not None:
                # Kept sandboxes keep their live processes: the next server attaches to them.
                await rec.sessions.kill_all(keep_attachable=kept)
            if rec.ended:
                continue
            if kept and rec.sandbox is not None:
                sb, rec.sandbox = rec.sandbox, None
                await self.manager.detach(sb)
                rec.log("server stopped; the sandbox keeps running for the next server")
                rec.save()  # with its live processes (sessions.rows)
            elif self.detaching and rec.status in ("PENDING", "PROVISIONING"):
                rec.log("server stopped before this sandbox started; the next server makes it")
            else:
                rec.set_status("TERMINATED", termination_reason="server shutdown")
        self.store.flush()

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._tg is not None, "service not started"
        self._tg.start_soon(fn, *args)

    async def _recover(self) -> None:
        """Take over what an earlier server on this state left (see the module docstring)."""
        recs = self.store.load()
        live = [r for r in recs if r.status in LIVE]
        if not self.db.persistent:
            return
        provider = self.manager.provider
        state = str(self.db.state_dir)
        try:
            infos = await provider.list({LABEL_STATE: state})
        except Exception as exc:
            log.warning("cannot list this state's sandboxes: %r", exc)
            infos = []
        by_record: dict[str, Any] = {}
        for info in infos:
            rid = info.labels.get(LABEL_ID, "")
            if rid in by_record:  # two containers for one row: keep the running one
                other = by_record[rid]
                extra = info if other.status == "running" else other
                by_record[rid] = other if extra is info else info
                await self._remove_quietly(extra.id)
            else:
                by_record[rid] = info
        adopt = provider.adopt if isinstance(provider, AdoptingProvider) else None
        for rec in live:
            rec.sessions = SessionTable()
            info = by_record.pop(rec.id, None)
            if info is not None and info.status == "running" and adopt is not None and rec.spec is not None:
                try:
                    inner = await adopt(info.id, rec.spec)
                except Exception as exc:
                    log.warning("cannot adopt %s (%s): %r", rec.id, info.id[:12], exc)
                    await self._remove_quietly(info.id)
                    why = f"its container could not be re-adopted after a server restart: {exc}"
                else:
                    await self._adopted(rec, inner, info.id)
                    continue
            elif info is not None:
                await self._remove_quietly(info.id)
                why = f"its container was {info.status} when the server restarted"
            else:
                why = "its container vanished while the server was down"
            if rec.status == "RUNNING":  # its files, processes, network were a client's: lost
                self._lost(rec, why)
            else:  # accepted, never handed out: (re)make it now, as a fresh create
                rec.log(f"server restarted before this sandbox started ({why}); queued again")
                rec.set_status("PENDING")
                self.admission.enqueue(rec)
        for info in by_record.values():  # containers of this state no live row claims
            await self._remove_quietly(info.id)
        self._admit()

    async def _adopted(self, rec: Record, inner: Any, container_id: str) -> None:
        """`rec`'s running container, adopted from an earlier server, is its sandbox again:
        its slot taken, a changed egress policy applied, its live processes re-attached."""
        rec.sandbox = self.manager.adopt(inner, age_s=time.time() - rec.created_at.timestamp())
        self.admission.take(rec.tenant)
        rec.container_id = container_id
        self.counters["adopted"] += 1
        rec.log("re-adopted after a server restart")
        await self._egress_after_start(rec)
        for row in rec.live:
            await self._reattach(rec, row)
        rec.live = []
        if rec.status != "RUNNING":
            rec.set_status("RUNNING")
        else:
            rec.save()

    async def _reattach(self, rec: Record, row: dict[str, Any]) -> None:
        """Attach to a live process an earlier server started in this sandbox."""
        assert rec.sandbox is not None
        try:
            argv, handle = list(row["argv"]), LiveHandle.model_validate(row["handle"])
            proc = await rec.sandbox.attach_live(handle, argv)
        except Exception as exc:
            rec.log(f"live process {row.get('uuid')} not re-attached: {exc}")
            return
        self.start_session(rec, Session(uuid=str(row["uuid"]), argv=argv, cwd=row.get("cwd"), process=proc))
        rec.log(f"live process {row['uuid']} pid={proc.pid} re-attached")

    def start_session(self, rec: Record, sess: Session) -> None:
        """Track a live process of `rec` (its row names it, for the next server) and pump its
        output to whoever attaches."""
        assert rec.sessions is not None
        rec.sessions.add(sess)
        rec.save()
        self._spawn(self._pump, rec, sess)

    async def _pump(self, rec: Record, sess: Session) -> None:
        await sess.pump()
        if not rec.ended:
            rec.save()  # the ended process leaves the row

    def _lost(self, rec: Record, why: str) -> None:
        self.counters["died"] += 1
        rec.set_status("ERROR", error_type="SANDBOX_LOST", error_message=why, termination_reason=f"SANDBOX_LOST: {why}")

    async def _remove_quietly(self, container_id: str) -> None:
        try:
            await self.manager.provider.remove(container_id)
        except Exception as exc:
            log.warning("removing %s failed: %r", container_id[:12], exc)

    # ---- create ------------------------------------------------------------------------

    def spec_for(self, body: CreateSandboxBody, record_id: str, tenant: str, policy: WirePolicy, explicit: bool = True) -> SandboxSpec:
        """Map prime's create fields onto a SandboxSpec; refuse what we cannot honour."""
        errors = []
        for name, what in (
            ("checkpoint_id", "checkpoints"),
            ("volumes", "volumes"),
            ("start_command", "start commands"),
        ):
            if getattr(body, name):
                errors.append(_field_error(name, f"{what} are not supported by this server"))
        if body.gpu_count and not body.gpu_type:
            errors.append(_field_error("gpu_type", "gpu_type is required when gpu_count > 0"))
        memory_mb = int(round(body.memory_gb * 1024))
        if memory_mb < MIN_MEMORY_MB:
            errors.append(_field_error(
                "memory_gb", f"memory_gb={body.memory_gb} is below the minimum {MIN_MEMORY_MB / 1024} ({MIN_MEMORY_MB} MiB)"
            ))
        if errors:
            raise InvalidRequest(errors)
        env = {**(body.environment_vars or {}), **(body.secrets or {})}
        ttl = self.config.max_ttl_s if body.timeout_minutes == -1 else min(body.timeout_minutes * 60.0, self.config.max_ttl_s)
        extra: dict[str, Any] = {}
        # A sandbox nobody asked network for (and the server default is none) gets no egress
        # plumbing at all; one that asked for "blocked" keeps it, so set_network can open it.
        if not (policy.is_blocked and not explicit):
            extra["egress"] = policy.to_spec_policy()
        if self.config.profile is not None:
            extra["profile"] = self.config.profile
        if self.config.image_pull is not None:
            extra["image_pull"] = self.config.image_pull
        try:
            return SandboxSpec(
                image=body.docker_image,
                cpu=body.cpu_cores,
                memory_mb=memory_mb,
                disk_mb=max(1, int(math.ceil((body.disk_size_gb or 5.0) * 1024))),
                gpus=body.gpu_count,
                env=env,
                ttl_s=ttl,
                exec_timeout_s=self.config.max_exec_timeout_s,
                output_limit_bytes=self.config.output_limit_bytes,
                labels=self.platform_labels(record_id, tenant),
                **extra,
            )
        except ValidationError as exc:
            raise InvalidRequest(
                [
                    _field_error(SPEC_TO_PRIME.get(str(e["loc"][0]) if e["loc"] else "", str(e["loc"][0]) if e["loc"] else "body"), e["msg"])
                    for e in exc.errors()
                ]
            ) from exc

    async def create(self, tenant: str, body: CreateSandboxBody) -> Record:
        """Record the sandbox (PENDING) and make it in the background. Raises InvalidRequest
        (422) or QuotaExceeded (429) before anything is made. The same idempotency key
        returns the same record."""
        if (old := self.store.by_idempotency(tenant, body.idempotency_key)) is not None:
            return old
        rid = self.store.new_id()
        try:
            asked = body.requested_policy()
        except ValueError as exc:
            raise InvalidRequest([_field_error("network_allowlist", str(exc))]) from exc
        policy = asked or self.default_policy
        spec = self.spec_for(body, rid, tenant, policy, explicit=asked is not None or self.config.egress_default is not None)
        image_error: str | None = None
        try:
            # A provider may look at the engine (images, free disk): not on the event loop.
            await anyio.to_thread.run_sync(self.manager.provider.check, spec)
        except SpecError as exc:
            msg, spec_field = str(exc), spec_error_field(exc)
            # An unknown image is what Prime reports as a failed sandbox (IMAGE_PULL_FAILED,
            # which the SDK raises as SandboxImagePullError); other spec errors are bad input.
            if spec_field != "image":
                raise InvalidRequest([_field_error(SPEC_TO_PRIME.get(spec_field, spec_field or "body"), msg)]) from exc
            image_error = msg
        if (old := self.store.by_idempotency(tenant, body.idempotency_key)) is not None:
            return old  # the same key arrived twice while we were checking
        idle = body.idle_timeout_minutes * 60.0 if body.idle_timeout_minutes else self.config.idle_timeout_s
        rec = Record(
            id=rid, tenant=tenant, body=body, spec=spec, ttl_s=spec.ttl_s or self.config.max_ttl_s, idle_s=idle,
            egress=Egress(policy=policy),
        )
        rec.sessions = SessionTable()
        rec.log(f"created: image={spec.image} cpu={spec.cpu} memory_mb={spec.memory_mb} disk_mb={spec.disk_mb} network={policy.describe()}")
        self.store.add(rec, body.idempotency_key)  # the row exists before any container
        if image_error is not None:
            self.counters["create_errors"] += 1
            rec.set_status("ERROR", error_type="IMAGE_PULL_FAILED", error_message=image_error, termination_reason=f"IMAGE_PULL_FAILED: {image_error}")
        else:
            self.admission.enqueue(rec)
            self._admit()
        return rec

    def _admit(self) -> None:
        """Start every waiting create a slot is free for; tell the rest why they wait."""
        while (rec := self.admission.next()) is not None:
            rec.set_status("PROVISIONING")
            self._spawn(self._provision, rec)
        waiting = self.admission.waiting()
        used, cap = self.admission.used, self.admission.slots
        for i, rec in enumerate(waiting):
            reason = (
                f"waiting for a free slot: this server runs {used} of its {cap} sandboxes (all tokens); "
                f"{i} queued ahead of this one, served fairly between tokens"
            )
            if rec.waiting_reason is None:
                rec.log(reason)
            rec.waiting_reason = reason

    def _on_pull(self, ev: Any) -> None:
        """Image pull progress, called in the provider's worker thread: handed to the event
        loop, where the sandboxes being made from that image say so in their waiting reason."""
        try:
            anyio.from_thread.run_sync(self._show_pull, ev)
        except RuntimeError:  # not an anyio worker thread: no progress to show
            pass

    def _show_pull(self, ev: Any) -> None:
        resolve = getattr(self.manager.provider, "resolve_image", lambda image: image)
        done, total = getattr(ev, "done_bytes", 0), getattr(ev, "total_bytes", 0)
        size = f" ({done / 1e6:.1f} of {total / 1e6:.1f} MB)" if total else ""
        reason = f"pulling image {ev.image}: {ev.status}{size}"
        for rec in self.store.all():
            if rec.status == "PROVISIONING" and rec.spec is not None and resolve(rec.spec.image) == ev.image:
                if rec.waiting_reason is None:
                    rec.log(f"pulling image {ev.image}")
                rec.waiting_reason = reason

    def _free_slot(self, rec: Record) -> None:
        self.admission.give(rec.tenant)
        self._admit()

    async def _provision(self, rec: Record) -> None:
        assert rec.spec is not None
        try:
            sb = await self.manager.acquire(rec.spec)
        except Exception as exc:
            self._free_slot(rec)
            self.counters["create_errors"] += 1
            log.warning("sandbox %s failed to start: %r", rec.id, exc)
            if not rec.ended:
                pull = isinstance(exc, ImagePullError) or (isinstance(exc, SpecError) and spec_error_field(exc) == "image")
                err = "IMAGE_PULL_FAILED" if pull else "PROVISIONING_FAILED"
                msg = f"{type(exc).__name__}: {exc}"
                rec.set_status("ERROR", error_type=err, error_message=msg, termination_reason=f"{err}: {msg}")
            return
        if rec.ended:  # deleted (or reaped) while it was being made
            await self.manager.release(sb)
            self._free_slot(rec)
            return
        rec.sandbox = sb
        rec.container_id = sb.id
        rec.touch()
        self.counters["created"] += 1
        await self._egress_after_start(rec)
        rec.set_status("RUNNING")

    # ---- egress --------------------------------------------------------------------------

    async def set_egress(self, rec: Record, policy: WirePolicy) -> None:
        """Record the policy (a new generation) and apply it to the running sandbox (a
        PENDING one gets it once it runs). EgressUnavailable (nothing recorded) when the
        sandbox was made without egress plumbing and the policy opens anything."""
        if rec.spec is not None and rec.spec.egress is None and not policy.is_blocked:
            raise EgressUnavailable(
                f"sandbox {rec.id} was made without network (this server's default); create it with "
                "network_allowlist or network_denylist (even []) to change its network later"
            )
        before = (rec.egress.policy, rec.egress.generation, rec.egress.error)
        rec.egress.policy = policy
        rec.egress.generation += 1
        rec.egress.error = None
        try:
            rec.save(durable=True)  # a policy a restart would forget is not applied
        except StateWriteError:
            rec.egress.policy, rec.egress.generation, rec.egress.error = before
            raise
        rec.log(f"egress policy {rec.egress.generation}: {policy.describe()}")
        if rec.sandbox is not None:
            await self._apply_egress(rec)

    async def _egress_after_start(self, rec: Record) -> None:
        """A sandbox starts with the policy of its spec (generation 1); one changed since
        (while it waited, or before a restart) is applied now."""
        if rec.egress.generation == 1:
            rec.egress.applied_generation = 1
        else:
            await self._apply_egress(rec)

    async def _apply_egress(self, rec: Record) -> None:
        sb = rec.sandbox
        assert sb is not None
        generation = rec.egress.generation
        try:
            if rec.spec is not None and rec.spec.egress is None:  # blocked; nothing to open
                rec.egress.applied_generation = max(rec.egress.applied_generation, generation)
                rec.save()
                return
            await sb.set_egress(rec.egress.policy.to_spec_policy())
        except Exception as exc:
            rec.egress.error = f"{type(exc).__name__}: {exc}"
            rec.log(f"egress policy {generation} not applied: {rec.egress.error}")
        else:
            rec.egress.applied_generation = max(rec.egress.applied_generation, generation)
        rec.save()

    # ---- auth --------------------------------------------------------------------------

    def gateway_auth(self, rec: Record, base_url: str) -> GatewayAuth:
        now = time.time()
        # Keep a token while it has more than a quarter of its life left; the SDK refreshes
        # 60 s before expiry and coalesces, so tokens rotate rarely. After a restart only its
        # hash is known, so the next request rotates (the old one stays good until expiry).
        if not rec.gw_token or rec.gw_expires - now < self.config.gateway_token_ttl_s / 4:
            before = (rec.gw_prev, rec.gw_token, rec.gw_hash, rec.gw_expires)
            rec.gw_prev = (rec.gw_hash, rec.gw_expires)
            rec.gw_token = secrets.token_urlsafe(24)
            rec.gw_hash = token_hash(rec.gw_token)
            rec.gw_expires = now + self.config.gateway_token_ttl_s
            try:
                rec.save(durable=True)  # a token a restart would not know is not handed out
            except StateWriteError:
                rec.gw_prev, rec.gw_token, rec.gw_hash, rec.gw_expires = before
                raise
        base = (self.config.public_url or base_url).rstrip("/")
        return GatewayAuth(
            gateway_url=f"{base}/gateway",
            user_ns=rec.tenant,
            job_id=rec.id,
            token=rec.gw_token,
            expires_at=datetime.fromtimestamp(rec.gw_expires, tz=UTC).isoformat().replace("+00:00", "Z"),
        )

    def gateway_record(self, user_ns: str, job_id: str, token: str) -> Record | None:
        """The record a gateway call may touch, or None (401)."""
        rec = self.store.get_any(job_id)
        if rec is None or rec.tenant != user_ns or not token:
            return None
        return rec if rec.gateway_token_ok(token) else None

    # ---- delete / reap / death ---------------------------------------------------------

    def terminate(
        self, rec: Record, reason: str, *, status: str = "TERMINATED", error_type: str | None = None,
        error_message: str | None = None, durable: bool = False,
    ) -> None:
        """End a sandbox. `durable` (a client's delete): when the state does not take the
        change, StateWriteError and the sandbox goes on as it was."""
        if rec.ended:
            return
        rec.set_status(status, termination_reason=reason, error_type=error_type or rec.error_type,
                       error_message=error_message or rec.error_message, durable=durable)
        queued = self.admission.drop(rec)
        if not queued:
            self._spawn(self._teardown, rec)

    async def _teardown(self, rec: Record) -> None:
        with anyio.CancelScope(shield=True):
            if rec.sessions is not None:
                await rec.sessions.kill_all()
            sb, rec.sandbox = rec.sandbox, None
            if sb is not None:
                try:
                    await self.manager.release(sb)
                except Exception as exc:
                    log.warning("releasing sandbox %s failed: %r", rec.id, exc)
                self._free_slot(rec)
            # else: still being made; _provision sees it ended and frees the slot

    def sandbox_died(self, rec: Record, exc: BaseException | None = None) -> None:
        """The sandbox's container is gone though nobody deleted it: ERROR, with the sandbox
        layer's verdict (SandboxGoneError.reason) as the error type when it has one."""
        if rec.ended or self.stopping:
            return
        reason = getattr(exc, "reason", None)
        msg = str(exc) if exc is not None else "the sandbox's container ended"
        self._died(rec, reason, msg)

    def _died(self, rec: Record, reason: str | None, msg: str) -> None:
        kind = DEATHS.get(reason or "", "SANDBOX_LOST")
        self.counters["died"] += 1
        log.warning("sandbox %s died: %s (%s)", rec.id, kind, msg)
        if kind != "SANDBOX_LOST" or rec.sandbox is None:
            self.terminate(rec, f"{kind}: {msg}", status="ERROR", error_type=kind, error_message=msg)
            return
        # Not known yet why: ERROR now (clients must not wait), and ask the sandbox layer
        # again before letting go of the container (its engine events may still be coming;
        # after our own remove they would read as ours).
        rec.set_status("ERROR", termination_reason=f"{kind}: {msg}", error_type=kind, error_message=msg)
        self._spawn(self._learn_then_teardown, rec)

    async def _learn_then_teardown(self, rec: Record) -> None:
        sb = rec.sandbox
        inspect = getattr(self.manager.provider, "inspect", None)
        if sb is not None and inspect is not None:
            try:
                with anyio.move_on_after(15):
                    info = await inspect(sb.id, wait_s=10.0)
                    if info is not None and info.error_type and info.error_type != "LOST" and info.status != "running":
                        kind = DEATHS.get(info.error_type, "SANDBOX_LOST")
                        msg = info.error_message or rec.error_message or ""
                        rec.log(f"why it died: {kind} ({msg})")
                        rec.error_type, rec.error_message, rec.termination_reason = kind, msg, f"{kind}: {msg}"
                        rec.save()
            except Exception as exc:
                log.warning("learning why %s died failed: %r", rec.id, exc)
        await self._teardown(rec)

    async def _check_alive(self) -> None:
        """Running sandboxes whose container vanished (OOM under gVisor, killed, TTL of the
        container itself): one listing per tick, not one probe per sandbox."""
        running = [r for r in self.store.all() if r.status == "RUNNING" and r.sandbox is not None]
        if not running:
            return
        try:
            infos = await self.manager.provider.list({"sandgym.owner": self.manager.run_id})
        except Exception as exc:
            log.warning("liveness listing failed: %r", exc)
            return
        up = {i.id for i in infos if i.status == "running"}
        for rec in running:
            sb = rec.sandbox
            if sb is None or rec.ended or sb.id in up:
                continue
            reason, msg = None, "the sandbox's container ended while it was running"
            try:
                info = await sb.info()  # the sandbox layer's account (OOM_KILLED, EXITED, ...)
            except Exception:
                info = None
            if info is not None and info.status == "running":
                continue  # listed a moment too early
            if info is not None and info.error_type:
                reason, msg = info.error_type, info.error_message or msg
            if not rec.ended and not self.stopping:
                self._died(rec, reason, msg)

    async def _reaper(self) -> None:
        tick = 0
        while True:
            await anyio.sleep(self.config.reap_interval_s)
            tick += 1
            now = time.time()
            for rec in self.store.all():
                if rec.ended:
                    continue
                if now > rec.deadline:
                    self.counters["reaped"] += 1
                    self.terminate(rec, "timeout", error_type="TIMEOUT")
                elif (
                    rec.status == "RUNNING"
                    and rec.idle_s is not None
                    and rec.active_ops == 0
                    and not (rec.sessions and rec.sessions.running())
                    and now - rec.last_active > rec.idle_s
                ):
                    self.counters["reaped"] += 1
                    self.terminate(rec, "idle timeout", error_type="TIMEOUT")
            try:
                await self._check_alive()
            except Exception as exc:  # the reaper must outlive a bad tick
                log.warning("liveness check failed: %r", exc)
            self.store.forget_old()
            self.store.flush()

    def metrics(self) -> dict[str, Any]:
        by_status: dict[str, int] = {}
        for rec in self.store.all():
            by_status[rec.status] = by_status.get(rec.status, 0) + 1
        return {
            "uptime_s": round(time.monotonic() - self.started_mono, 1),
            "provider": self.manager.provider.name,
            "max_sandboxes": self.config.max_sandboxes,
            "quota_per_token": self.store.quota,
            "live_sandboxes": self.manager.live,
            "slots_used": self.admission.used,
            "queued": len(self.admission.waiting()),
            "records_by_status": by_status,
            "state_dir": str(self.db.state_dir) if self.db.persistent else None,
            **self.counters,
        }
