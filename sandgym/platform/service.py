"""The platform's state machine: records, the SandboxManager behind them, creation in the
background (PENDING -> RUNNING | ERROR), deletion (-> TERMINATED), TTL and idle reaping."""

from __future__ import annotations

import hmac
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import anyio
from anyio.abc import TaskGroup
from pydantic import ValidationError

from sandgym.sandboxes.base import Provider
from sandgym.sandboxes.errors import SpecError
from sandgym.sandboxes.manager import SandboxManager
from sandgym.sandboxes.spec import SandboxSpec

from .models import CreateSandboxBody, GatewayAuth
from .sessions import SessionTable
from .store import Record, Store

log = logging.getLogger(__name__)

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
}


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
    quota: int | None = None  # live sandboxes per token; default max_sandboxes
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


class Service:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store = Store(quota=config.quota or config.max_sandboxes, retain_s=config.retain_ended_s)
        self.manager = SandboxManager(
            config.provider,
            max_sandboxes=config.max_sandboxes,
            create_retries=0,
            provider_options=config.provider_options or None,
        )
        self._tg: TaskGroup | None = None
        self.started_mono = time.monotonic()
        self.counters = {"created": 0, "create_errors": 0, "deleted": 0, "reaped": 0, "execs": 0}

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> "Service":
        await self.manager.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._reaper)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for rec in self.store.all():
            if not rec.ended:
                rec.set_status("TERMINATED", termination_reason="server shutdown")
        try:
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
                await self._tg.__aexit__(None, None, None)
        finally:
            await self.manager.__aexit__(None, None, None)

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._tg is not None, "service not started"
        self._tg.start_soon(fn, *args)

    # ---- create ------------------------------------------------------------------------

    def spec_for(self, body: CreateSandboxBody, record_id: str, tenant: str) -> SandboxSpec:
        """Map prime's create fields onto a SandboxSpec; refuse what we cannot honour."""
        errors = []
        for name, what in (
            ("checkpoint_id", "checkpoints"),
            ("volumes", "volumes"),
            ("network_allowlist", "network egress (sandboxes have no network)"),
            ("start_command", "start commands"),
        ):
            if getattr(body, name):
                errors.append(_field_error(name, f"{what} are not supported by this server"))
        if body.network_denylist:
            errors.append(_field_error("network_denylist", "sandboxes have no network; drop the denylist"))
        if body.gpu_count and not body.gpu_type:
            errors.append(_field_error("gpu_type", "gpu_type is required when gpu_count > 0"))
        if errors:
            raise InvalidRequest(errors)
        env = {**(body.environment_vars or {}), **(body.secrets or {})}
        ttl = self.config.max_ttl_s if body.timeout_minutes == -1 else min(body.timeout_minutes * 60.0, self.config.max_ttl_s)
        try:
            return SandboxSpec(
                image=body.docker_image,
                cpu=body.cpu_cores,
                memory_mb=max(16, int(round(body.memory_gb * 1024))),
                disk_mb=max(1, int(math.ceil((body.disk_size_gb or 5.0) * 1024))),
                gpus=body.gpu_count,
                env=env,
                ttl_s=ttl,
                exec_timeout_s=self.config.max_exec_timeout_s,
                output_limit_bytes=self.config.output_limit_bytes,
                labels={"platform.id": record_id, "platform.tenant": tenant},
            )
        except ValidationError as exc:
            raise InvalidRequest(
                [
                    _field_error(SPEC_TO_PRIME.get(str(e["loc"][0]) if e["loc"] else "", str(e["loc"][0]) if e["loc"] else "body"), e["msg"])
                    for e in exc.errors()
                ]
            ) from exc

    def create(self, tenant: str, body: CreateSandboxBody) -> Record:
        """Record the sandbox (PENDING) and make it in the background. Raises InvalidRequest
        (422) or QuotaExceeded (429). The same idempotency key returns the same record."""
        if (old := self.store.by_idempotency(tenant, body.idempotency_key)) is not None:
            return old
        rid = self.store.new_id()
        spec = self.spec_for(body, rid, tenant)
        image_error: str | None = None
        try:
            self.manager.provider.check(spec)
        except SpecError as exc:
            msg, spec_field = str(exc), spec_error_field(exc)
            # An unknown image is what Prime reports as a failed sandbox (IMAGE_PULL_FAILED,
            # which the SDK raises as SandboxImagePullError); other spec errors are bad input.
            if spec_field != "image":
                raise InvalidRequest([_field_error(SPEC_TO_PRIME.get(spec_field, "body"), msg)]) from exc
            image_error = msg
        idle = body.idle_timeout_minutes * 60.0 if body.idle_timeout_minutes else self.config.idle_timeout_s
        rec = Record(id=rid, tenant=tenant, body=body, spec=spec, ttl_s=spec.ttl_s or self.config.max_ttl_s, idle_s=idle)
        rec.sessions = SessionTable()
        self.store.add(rec, body.idempotency_key)
        rec.log(f"created: image={spec.image} cpu={spec.cpu} memory_mb={spec.memory_mb} disk_mb={spec.disk_mb}")
        if image_error is not None:
            self.counters["create_errors"] += 1
            rec.set_status("ERROR", error_type="IMAGE_PULL_FAILED", error_message=image_error)
        else:
            self._spawn(self._provision, rec)
        return rec

    async def _provision(self, rec: Record) -> None:
        assert rec.spec is not None
        try:
            sb = await self.manager.acquire(rec.spec)
        except Exception as exc:
            self.counters["create_errors"] += 1
            log.warning("sandbox %s failed to start: %r", rec.id, exc)
            if not rec.ended:
                err = "IMAGE_PULL_FAILED" if isinstance(exc, SpecError) and spec_error_field(exc) == "image" else "PROVISIONING_FAILED"
                rec.set_status("ERROR", error_type=err, error_message=f"{type(exc).__name__}: {exc}")
            return
        if rec.ended:  # deleted (or reaped) while it was being made
            await self.manager.release(sb)
            return
        rec.sandbox = sb
        rec.touch()
        self.counters["created"] += 1
        rec.set_status("RUNNING")

    # ---- auth --------------------------------------------------------------------------

    def gateway_auth(self, rec: Record, base_url: str) -> GatewayAuth:
        now = time.time()
        # Keep a token while it has more than a quarter of its life left; the SDK refreshes
        # 60 s before expiry and coalesces, so tokens rotate rarely.
        if rec.gw_expires - now < self.config.gateway_token_ttl_s / 4:
            # The previous token stays good until its own expiry: other clients hold it.
            rec.gw_prev = (rec.gw_token, rec.gw_expires)
            rec.gw_token = secrets.token_urlsafe(24)
            rec.gw_expires = now + self.config.gateway_token_ttl_s
        base = (self.config.public_url or base_url).rstrip("/")
        return GatewayAuth(
            gateway_url=f"{base}/gateway",
            user_ns=rec.tenant,
            job_id=rec.id,
            token=rec.gw_token,
            expires_at=datetime.fromtimestamp(rec.gw_expires, tz=timezone.utc).isoformat().replace("+00:00", "Z"),
        )

    def gateway_record(self, user_ns: str, job_id: str, token: str) -> Record | None:
        """The record a gateway call may touch, or None (401)."""
        rec = self.store.get_any(job_id)
        if rec is None or rec.tenant != user_ns or not token:
            return None
        now = time.time()
        for known, expires in ((rec.gw_token, rec.gw_expires), rec.gw_prev):
            if known and now <= expires and hmac.compare_digest(known.encode(), token.encode()):
                return rec
        return None

    # ---- delete / reap -----------------------------------------------------------------

    def terminate(self, rec: Record, reason: str, *, status: str = "TERMINATED", error_type: str | None = None) -> None:
        if rec.ended:
            return
        rec.set_status(status, termination_reason=reason, error_type=error_type or rec.error_type)
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

    async def _reaper(self) -> None:
        while True:
            await anyio.sleep(self.config.reap_interval_s)
            now = time.monotonic()
            for rec in self.store.all():
                if rec.ended:
                    continue
                if now - rec.created_mono > rec.ttl_s:
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
            self.store.forget_old()

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
            "records_by_status": by_status,
            **self.counters,
        }

