"""In-memory records of the platform's sandboxes, indexed per tenant.

A record outlives its sandbox for `retain_s` after it ended, so `get` after `delete` answers
TERMINATED (as Prime does) and a second delete is a no-op instead of a 404.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .models import ENDED, CreateSandboxBody

if TYPE_CHECKING:
    from sandgym.sandboxes.base import Sandbox
    from sandgym.sandboxes.spec import SandboxSpec

    from .sessions import SessionTable


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class QuotaExceeded(Exception):
    pass


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
    ended_mono: float | None = None
    error_type: str | None = None
    error_message: str | None = None
    termination_reason: str | None = None
    sandbox: Sandbox | None = None
    gw_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    gw_expires: float = 0.0
    gw_prev: tuple[str, float] = ("", 0.0)  # the token before the last rotation, and its expiry
    created_mono: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    logs: deque[str] = field(default_factory=lambda: deque(maxlen=500))
    sessions: SessionTable | None = None
    active_ops: int = 0

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def log(self, line: str) -> None:
        self.logs.append(f"{utcnow().isoformat(timespec='milliseconds')} {line}")

    def set_status(self, status: str, **fields: Any) -> None:
        self.status = status
        for k, v in fields.items():
            setattr(self, k, v)
        self.updated_at = utcnow()
        if status == "RUNNING" and self.started_at is None:
            self.started_at = self.updated_at
        if status in ENDED and self.terminated_at is None:
            self.terminated_at = self.updated_at
            self.ended_mono = time.monotonic()
        self.log(f"status {status}" + (f" ({self.error_type}: {self.error_message})" if self.error_type else ""))

    def touch(self) -> None:
        self.last_active = time.monotonic()


class Store:
    """Records by id, per tenant, with idempotency keys and live-sandbox quotas."""

    def __init__(self, *, quota: int, retain_s: float = 3600.0) -> None:
        self.quota = quota
        self.retain_s = retain_s
        self._by_id: dict[str, Record] = {}
        self._idem: dict[tuple[str, str], str] = {}

    @staticmethod
    def new_id() -> str:
        # Globally unique: clients spreading over several servers share one auth cache file.
        return "sb" + uuid.uuid4().hex[:22]

    def add(self, rec: Record, idempotency_key: str | None) -> None:
        if self.live_count(rec.tenant) >= self.quota:
            raise QuotaExceeded(
                f"quota reached: {self.quota} live sandboxes per token; delete some first"
            )
        self._by_id[rec.id] = rec
        if idempotency_key:
            self._idem[(rec.tenant, idempotency_key)] = rec.id

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
        cutoff = time.monotonic() - self.retain_s
        old = {rid for rid, r in self._by_id.items() if r.ended_mono is not None and r.ended_mono < cutoff}
        for rid in old:
            del self._by_id[rid]
        if old:
            self._idem = {k: v for k, v in self._idem.items() if v not in old}
