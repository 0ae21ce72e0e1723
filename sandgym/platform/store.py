"""Records of the platform's sandboxes, indexed per tenant, written through to SQLite.

A record outlives its sandbox for `retain_s` after it ended, so `get` after `delete` answers
TERMINATED (as Prime does) and a second delete is a no-op instead of a 404.

Every change of status (and every new record) is written at once; activity times and event
log lines are written in batches by `flush()` (the reaper calls it every tick), so an exec
costs no disk write.

When the state directory does not take a write (full disk): a new record is refused
(StateWriteError: no container is made for it); a change a client asked for (`durable`: a
delete, a network policy, gateway credentials) is undone in memory and refused, so the
client is told and the sandbox stays as it was; a change the server observed (a sandbox
started, died, timed out) stays in memory, since it is true, and is written by a later
`flush()` once the directory takes writes again, as are the batched lines and times.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .db import StateDB, StateWriteError
from .egress import WirePolicy
from .models import ENDED, CreateSandboxBody

if TYPE_CHECKING:
    from sandgym.sandboxes.manager import ManagedSandbox
    from sandgym.sandboxes.spec import SandboxSpec

    from .sessions import SessionTable

log = logging.getLogger(__name__)

LIVE = ("PENDING", "PROVISIONING", "RUNNING")
LOG_LINES = 500
# What set_status changes, so a refused durable change can be undone.
_STATUS_FIELDS = ("status", "updated_at", "started_at", "terminated_at", "waiting_reason")


def utcnow() -> datetime:
    return datetime.now(UTC)


def _ts(d: datetime | None) -> float | None:
    return d.timestamp() if d is not None else None


def _dt(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, tz=UTC) if t is not None else None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class QuotaExceeded(Exception):
    pass


@dataclass
class Egress:
    """The sandbox's egress policy as the wire shows it; `applied_generation` trails
    `generation` until the sandbox enforces the latest policy."""

    policy: WirePolicy = field(default_factory=WirePolicy.blocked)
    generation: int = 1
    applied_generation: int = 0
    error: str | None = None

    def to_row(self) -> dict[str, Any]:
        return {"policy": self.policy.model_dump(), "generation": self.generation,
                "applied_generation": self.applied_generation, "error": self.error}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Egress:
        return cls(WirePolicy(**row["policy"]), row["generation"], row["applied_generation"], row.get("error"))


@dataclass
class Record:
    id: str
    tenant: str
    body: CreateSandboxBody
    spec: SandboxSpec | None
    ttl_s: float
    idle_s: float | None
    status: str = "PENDING"
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    started_at: datetime | None = None
    terminated_at: datetime | None = None
    error_type: str | None = None
    error_message: str | None = None
    termination_reason: str | None = None
    waiting_reason: str | None = None  # why a PENDING sandbox waits (not persisted)
    container_id: str | None = None
    egress: Egress = field(default_factory=Egress)
    sandbox: ManagedSandbox | None = None
    gw_token: str = ""  # the current gateway token in clear (memory only)
    gw_hash: str = ""
    gw_expires: float = 0.0
    gw_prev: tuple[str, float] = ("", 0.0)  # hash of the token before the last rotation, expiry
    last_active: float = field(default_factory=time.time)
    logs: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    sessions: SessionTable | None = None
    live: list[dict[str, Any]] = field(default_factory=list)  # processes to re-attach (from the row)
    active_ops: int = 0
    store: Store | None = field(default=None, repr=False)
    _unsaved_logs: list[str] = field(default_factory=list, repr=False)
    _saved_active: float = field(default=0.0, repr=False)
    _db_lines: int = field(default=0, repr=False)  # event lines in the database

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def deadline(self) -> float:
        return self.created_at.timestamp() + self.ttl_s

    def log(self, line: str) -> None:
        text = f"{utcnow().isoformat(timespec='milliseconds')} {line}"
        self.logs.append(text)
        self._unsaved_logs.append(text)

    def set_status(self, status: str, *, durable: bool = False, **fields: Any) -> None:
        """Change the status (and `fields`) and write it. `durable`: a change a client asked
        for, undone and raised (StateWriteError) when the state does not take it."""
        before = {k: getattr(self, k) for k in (*_STATUS_FIELDS, *fields)}
        logs = len(self.logs), len(self._unsaved_logs)
        try:
            self._set_status(status, durable=durable, **fields)
        except StateWriteError:
            for k, v in before.items():
                setattr(self, k, v)
            while len(self._unsaved_logs) > logs[1]:
                self._unsaved_logs.pop()
                self.logs.pop()
            raise

    def _set_status(self, status: str, *, durable: bool, **fields: Any) -> None:
        self.status = status
        for k, v in fields.items():
            setattr(self, k, v)
        self.updated_at = utcnow()
        if status != "PENDING":
            self.waiting_reason = None
        if status == "RUNNING" and self.started_at is None:
            self.started_at = self.updated_at
        if status in ENDED and self.terminated_at is None:
            self.terminated_at = self.updated_at
        self.log(f"status {status}" + (f" ({self.error_type}: {self.error_message})" if self.error_type else ""))
        self.save(durable=durable)

    def save(self, *, durable: bool = False) -> None:
        """Write the record; `durable`: raise StateWriteError when the state does not take it
        (else it is written by a later flush)."""
        if self.store is not None:
            self.store.save(self, durable=durable)


    def touch(self) -> None:
        self.last_active = time.time()

    def gateway_token_ok(self, token: str) -> bool:
        now = time.time()
        given = token_hash(token)
        return any(
            known and now <= expires and hmac.compare_digest(known, given)
            for known, expires in ((self.gw_hash, self.gw_expires), self.gw_prev)
        )

    # ---- rows ----------------------------------------------------------------------------

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "status": self.status,
            "body": self.body.model_dump(mode="json"),
            "spec": self.spec.model_dump(mode="json") if self.spec is not None else None,
            "ttl_s": self.ttl_s,
            "idle_s": self.idle_s,
            "created_at": self.created_at.timestamp(),
            "updated_at": self.updated_at.timestamp(),
            "started_at": _ts(self.started_at),
            "ended_at": _ts(self.terminated_at),
            "error_type": self.error_type,
            "error_message": self.error_message,
            "termination_reason": self.termination_reason,
            "container_id": self.container_id,
            "egress": self.egress.to_row(),
            "gw_hash": self.gw_hash,
            "gw_expires": self.gw_expires,
            "gw_prev": list(self.gw_prev),
            "last_active": self.last_active,
            "live": self.sessions.rows() if self.sessions is not None else self.live,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Record:
        from sandgym.sandboxes.spec import SandboxSpec

        return cls(
            id=row["id"],
            tenant=row["tenant"],
            body=CreateSandboxBody.model_validate(row["body"]),
            spec=SandboxSpec.model_validate(row["spec"]) if row.get("spec") else None,
            ttl_s=row["ttl_s"],
            idle_s=row["idle_s"],
            status=row["status"],
            created_at=_dt(row["created_at"]) or utcnow(),
            updated_at=_dt(row["updated_at"]) or utcnow(),
            started_at=_dt(row.get("started_at")),
            terminated_at=_dt(row.get("ended_at")),
            error_type=row.get("error_type"),
            error_message=row.get("error_message"),
            termination_reason=row.get("termination_reason"),
            container_id=row.get("container_id"),
            egress=Egress.from_row(row["egress"]) if row.get("egress") else Egress(),
            gw_hash=row.get("gw_hash", ""),
            gw_expires=row.get("gw_expires", 0.0),
            gw_prev=tuple(row.get("gw_prev") or ("", 0.0)),
            last_active=row.get("last_active") or time.time(),
            live=list(row.get("live") or []),
        )


class Store:
    """Records by id, per tenant, with idempotency keys and per-token quotas, kept in
    memory and written through to `db`."""

    def __init__(self, db: StateDB, *, quota: int, quotas: dict[str, int] | None = None, retain_s: float = 3600.0) -> None:
        self.db = db
        self.quota = quota
        self.quotas = dict(quotas or {})  # tenant -> its own quota
        self.retain_s = retain_s
        self._by_id: dict[str, Record] = {}
        self._idem: dict[tuple[str, str], str] = {}
        self._unwritten: set[str] = set()  # ids whose last change the state did not take yet

    def load(self) -> list[Record]:
        """Read every record the database holds (at start-up); returns them."""
        for row in self.db.load():
            rec = Record.from_row(row)
            rec.store = self
            rec.logs.extend(self.db.events(rec.id, LOG_LINES))
            rec._db_lines = len(rec.logs)
            self._by_id[rec.id] = rec
        for tenant, key, sid in self.db.idempotency_keys():
            if sid in self._by_id:
                self._idem[(tenant, key)] = sid
        return list(self._by_id.values())

    @staticmethod
    def new_id() -> str:
        # Globally unique: clients spreading over several servers share one auth cache file.
        return "sb" + uuid.uuid4().hex[:22]

    def quota_of(self, tenant: str) -> int:
        return self.quotas.get(tenant, self.quota)

    def add(self, rec: Record, idempotency_key: str | None) -> None:
        quota = self.quota_of(rec.tenant)
        if self.live_count(rec.tenant) >= quota:
            raise QuotaExceeded(f"quota reached: {quota} live sandboxes per token; delete some first")
        rec.store = self
        self.db.insert(rec.to_row(), idempotency_key)
        self._by_id[rec.id] = rec
        if idempotency_key:
            self._idem[(rec.tenant, idempotency_key)] = rec.id

    def save(self, rec: Record, *, durable: bool = False) -> None:
        try:
            self.db.update(rec.to_row())
        except StateWriteError as exc:
            if durable:
                raise
            if rec.id not in self._unwritten:
                log.warning("sandbox %s: %s; kept in memory, written once the state takes writes again", rec.id, exc)
            self._unwritten.add(rec.id)
        else:
            self._unwritten.discard(rec.id)

    def flush(self) -> None:
        """Write what is pending: records whose change the state did not take, log lines and
        activity times (batched; called every reaper tick). Nothing is dropped when the state
        does not take it: the next flush tries again."""
        try:
            for rid in sorted(self._unwritten):
                if (rec := self._by_id.get(rid)) is not None:
                    self.db.update(rec.to_row())
                self._unwritten.discard(rid)
            events = [(rec.id, line) for rec in self._by_id.values() for line in rec._unsaved_logs]
            self.db.add_events(events)
            for rec in self._by_id.values():
                rec._db_lines += len(rec._unsaved_logs)
                rec._unsaved_logs.clear()
            touched = [(rec.last_active, rec.id) for rec in self._by_id.values()
                       if rec.last_active != rec._saved_active and not rec.ended]
            self.db.touch_many(touched)
            for active, rid in touched:
                self._by_id[rid]._saved_active = active
            for rec in self._by_id.values():
                if rec._db_lines > 2 * LOG_LINES:  # the log endpoint shows the last LOG_LINES
                    self.db.trim_events(rec.id, LOG_LINES)
                    rec._db_lines = LOG_LINES
        except StateWriteError as exc:
            log.warning("%s; %d records and the pending log lines wait for the next flush", exc, len(self._unwritten))

    def by_idempotency(self, tenant: str, key: str | None) -> Record | None:
        if not key:
            return None
        rid = self._idem.get((tenant, key))
        return self._by_id.get(rid) if rid else None

    def get(self, tenant: str, sandbox_id: str) -> Record | None:
        rec = self._by_id.get(sandbox_id)
        return rec if rec is not None and rec.tenant == tenant else None

    def get_any(self, sandbox_id: str) -> Record | None:
        return self._by_id.get(sandbox_id)

    def for_tenant(self, tenant: str) -> list[Record]:
        return sorted(
            (r for r in self._by_id.values() if r.tenant == tenant),
            key=lambda r: r.created_at,
            reverse=True,
        )

    def live_count(self, tenant: str | None = None) -> int:
        return sum(1 for r in self._by_id.values() if not r.ended and (tenant is None or r.tenant == tenant))

    def all(self) -> list[Record]:
        return list(self._by_id.values())

    def forget_old(self) -> None:
        """Drop records that ended more than `retain_s` ago (and their idempotency keys)."""
        cutoff = time.time() - self.retain_s
        old = [rid for rid, r in self._by_id.items() if r.terminated_at is not None and r.terminated_at.timestamp() < cutoff]
        if not old:
            return
        try:
            self.db.forget(old)
        except StateWriteError as exc:
            log.warning("%s; %d ended records are forgotten later", exc, len(old))
            return
        for rid in old:
            del self._by_id[rid]
            self._unwritten.discard(rid)
        gone = set(old)
        self._idem = {k: v for k, v in self._idem.items() if v not in gone}
