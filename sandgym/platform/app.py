"""The FastAPI app: Prime's sandbox control plane under /api/v1, the gateway under /gateway,
health and metrics, OpenAPI docs at /docs. Endpoints this server does not offer (checkpoints,
LAN networks, volumes, images, ssh, background-job batches) answer 404.

Request bodies past `max_body_bytes` (uploads: `max_upload_bytes`) answer 413 before they are
read whole (limits.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .auth import TokenAuth
from .db import StateWriteError
from .gateway import build_router
from .limits import BodyLimit
from .models import (
    BulkDeleteBody,
    BulkDeleteOut,
    CreateSandboxBody,
    DeleteOut,
    EgressLogOut,
    EgressPolicyIn,
    EgressPolicyOut,
    ErrorContextOut,
    GatewayAuth,
    KeyLimits,
    LogsOut,
    SandboxListOut,
    SandboxOut,
    Status,
    StatusBatchBody,
    StatusBatchOut,
    StatusError,
    StatusSnapshot,
    WhoAmI,
    WhoAmIOut,
)
from .service import EgressUnavailable, InvalidRequest, ServerConfig, Service
from .store import QuotaExceeded, Record

log = logging.getLogger(__name__)


_NOT_FOUND: dict[int | str, dict[str, object]] = {404: {"description": "No such sandbox for this token"}}


def sandbox_out(rec: Record, service: Service, request: Request, *, with_auth: bool = False) -> SandboxOut:
    b = rec.body
    spec = rec.spec
    policy = rec.egress.policy
    advanced = dict(b.advanced_configs or {})
    if rec.waiting_reason:
        # The CLI's `sandbox get` prints advanced configs, not errorMessage: say it there too.
        advanced["waitingReason"] = rec.waiting_reason
    return SandboxOut(
        id=rec.id,
        name=b.name,
        docker_image=b.docker_image,
        cpu_cores=b.cpu_cores,
        memory_gb=b.memory_gb,
        disk_size_gb=b.disk_size_gb or 5.0,
        disk_mount_path=spec.workdir if spec else "/workspace",
        gpu_count=b.gpu_count,
        gpu_type=b.gpu_type,
        status=rec.status,
        waiting_reason=rec.waiting_reason,
        network_allowlist=policy.allowlist if policy.allowlist is not None or policy.denylist is not None else [],
        network_denylist=policy.denylist,
        timeout_minutes=b.timeout_minutes,
        idle_timeout_minutes=b.idle_timeout_minutes,
        termination_reason=rec.termination_reason,
        environment_vars=b.environment_vars,
        labels=b.labels,
        created_at=rec.created_at,
        updated_at=rec.updated_at,
        started_at=rec.started_at,
        terminated_at=rec.terminated_at,
        error_type=rec.error_type,
        error_message=rec.error_message if rec.error_message or not rec.waiting_reason else rec.waiting_reason,
        user_id=rec.tenant,
        team_id=b.team_id,
        region=b.region,
        advanced_configs=advanced or None,
        gateway_auth=service.gateway_auth(rec, str(request.base_url)) if with_auth and not rec.ended else None,
    )


def create_app(config: ServerConfig) -> FastAPI:
    auth = TokenAuth(config.tokens)
    service = Service(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with service:
            yield

    app = FastAPI(
        title="sandgym platform",
        version="0.1.0",
        description=(
            "Self-hosted sandboxes speaking the prime-sandboxes 0.5.1 REST contract. Point the "
            "unmodified SDK here with PRIME_API_BASE_URL and PRIME_API_KEY."
        ),
        lifespan=lifespan,
        responses={401: {"description": "Missing or invalid API token"}},
    )
    app.state.service = service
    app.add_middleware(BodyLimit, default=config.max_body_bytes, uploads=config.max_upload_bytes)
    # A plain default (not an Annotated alias): annotations are strings here and FastAPI
    # resolves them in module globals, where a local alias would not be found.
    tenant_dep = Depends(auth)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 405 means the path exists for another method: to a client probing an optional
        # endpoint (checkpoints, networks, ...) that is the same as "not offered here".
        if exc.status_code == 405 and request.url.path not in static_paths:
            return JSONResponse({"detail": f"{request.method} {request.url.path} is not supported by this server"}, status_code=404)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(StateWriteError)
    async def state_full(request: Request, exc: StateWriteError) -> JSONResponse:
        # Nothing was changed (store.py): the client may retry once the operator made room.
        log.error("%s %s refused: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": f"{exc}; nothing was changed, retry later"}, status_code=507)

    @app.exception_handler(RequestValidationError)
    async def bad_input(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": str(e.get("msg"))}
            for e in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    def own(tenant: str, sandbox_id: str) -> Record:
        rec = service.store.get(tenant, sandbox_id)
        if rec is None:
            raise HTTPException(404, detail=f"Sandbox {sandbox_id} not found")
        return rec

    # ---- control plane ---------------------------------------------------------------

    @app.post(
        "/api/v1/sandbox",
        response_model=SandboxOut,
        tags=["sandboxes"],
        summary="Create a sandbox (answers PENDING; it becomes RUNNING or ERROR in the background)",
        responses={429: {"description": "This token's quota of live sandboxes is used up"}},
    )
    async def create(body: CreateSandboxBody, request: Request, tenant: str = tenant_dep) -> JSONResponse:
        try:
            rec = await service.create(tenant, body)
        except InvalidRequest as exc:
            return JSONResponse({"detail": exc.errors}, status_code=422)
        except QuotaExceeded as exc:
            return JSONResponse({"detail": str(exc)}, status_code=429)
        out = sandbox_out(rec, service, request, with_auth=True)
        return JSONResponse(out.model_dump(mode="json", by_alias=True))

    @app.get("/api/v1/sandbox", response_model=SandboxListOut, tags=["sandboxes"], summary="List sandboxes")
    async def list_sandboxes(
        request: Request,
        tenant: str = tenant_dep,
        page: int = Query(1, ge=1, le=1_000_000),
        per_page: int = Query(50, ge=1, le=100),
        status: Status | None = Query(None),
        labels: list[str] | None = Query(None, description="sandboxes carrying all these labels"),
        is_active: bool | None = Query(None, description="true: only not-ended sandboxes"),
        team_id: str | None = Query(None),
        user_id: str | None = Query(None),
    ) -> JSONResponse:
        recs = service.store.for_tenant(tenant)
        if status:
            recs = [r for r in recs if r.status == status]
        if labels:
            want = set(labels)
            recs = [r for r in recs if want <= set(r.body.labels)]
        if is_active:
            recs = [r for r in recs if not r.ended]
        total = len(recs)
        chunk = recs[(page - 1) * per_page : page * per_page]
        out = SandboxListOut(
            sandboxes=[sandbox_out(r, service, request) for r in chunk],
            total=total,
            page=page,
            per_page=per_page,
            has_next=page * per_page < total,
        )
        return JSONResponse(out.model_dump(mode="json", by_alias=True))

    @app.delete(
        "/api/v1/sandbox",
        response_model=BulkDeleteOut,
        tags=["sandboxes"],
        summary="Delete many sandboxes: by ids, by labels, or all of this token's (user_id / all_users alone)",
        responses={403: {"description": "user_id names another user"}},
    )
    async def bulk_delete(body: BulkDeleteBody, tenant: str = tenant_dep) -> JSONResponse:
        if body.user_id is not None and body.user_id != tenant:
            return JSONResponse({"detail": f"user_id {body.user_id!r} is not this token's user ({tenant})"}, status_code=403)
        targets: list[Record] = []
        failed: list[dict[str, str]] = []
        if body.everything:
            targets = [r for r in service.store.for_tenant(tenant) if not r.ended]
        if body.sandbox_ids:
            for sid in dict.fromkeys(body.sandbox_ids):
                rec = service.store.get(tenant, sid)
                if rec is None:
                    failed.append({"sandbox_id": sid, "error": "not found"})
                else:
                    targets.append(rec)
        if body.labels:
            want = set(body.labels)
            targets += [
                r for r in service.store.for_tenant(tenant) if not r.ended and want <= set(r.body.labels) and r not in targets
            ]
        ok: list[str] = []
        for rec in targets:
            try:
                service.terminate(rec, "deleted", durable=True)
            except StateWriteError as exc:
                failed.append({"sandbox_id": rec.id, "error": f"{exc}; not deleted"})
            else:
                ok.append(rec.id)
        service.counters["deleted"] += len(ok)
        out = BulkDeleteOut(succeeded=ok, failed=failed, message=f"deleted {len(ok)} sandboxes, {len(failed)} failed")
        return JSONResponse(out.model_dump())

    @app.post(
        "/api/v1/sandbox/status:batchGet",
        response_model=StatusBatchOut,
        tags=["sandboxes"],
        summary="Status of up to 100 sandboxes",
    )
    async def batch_status(body: StatusBatchBody, tenant: str = tenant_dep) -> StatusBatchOut:
        # A short long-poll: while every requested sandbox is still PENDING, wait (up to
        # status_wait_s) for one to change. The SDK's wait_for_creation sleeps ~1 s after a
        # PENDING answer; answering the change instead saves most of that sleep.
        recs = [r for sid in body.sandbox_ids if (r := service.store.get(tenant, sid)) is not None]
        deadline = time.monotonic() + config.status_wait_s
        while recs and all(r.status in ("PENDING", "PROVISIONING") for r in recs) and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        statuses, errors = [], []
        for sid in body.sandbox_ids:
            rec = service.store.get(tenant, sid)
            if rec is None:
                errors.append(StatusError(sandbox_id=sid, code="NOT_FOUND", message=f"Sandbox {sid} not found"))
            else:
                statuses.append(
                    StatusSnapshot(
                        sandbox_id=sid,
                        status=rec.status,
                        error_type=rec.error_type,
                        error_message=rec.error_message or rec.waiting_reason,
                        waiting_reason=rec.waiting_reason,
                    )
                )
        return StatusBatchOut(statuses=statuses, errors=errors)

    @app.get("/api/v1/sandbox/{sandbox_id}", response_model=SandboxOut, responses=_NOT_FOUND, tags=["sandboxes"], summary="Get a sandbox")
    async def get(sandbox_id: str, request: Request, tenant: str = tenant_dep) -> JSONResponse:
        out = sandbox_out(own(tenant, sandbox_id), service, request)
        return JSONResponse(out.model_dump(mode="json", by_alias=True))

    @app.delete("/api/v1/sandbox/{sandbox_id}", response_model=DeleteOut, responses=_NOT_FOUND, tags=["sandboxes"], summary="Delete a sandbox (idempotent)")
    async def delete(sandbox_id: str, tenant: str = tenant_dep) -> DeleteOut:
        rec = own(tenant, sandbox_id)
        if not rec.ended:
            service.terminate(rec, "deleted", durable=True)
            service.counters["deleted"] += 1
        return DeleteOut(id=rec.id, status=rec.status)

    @app.post("/api/v1/sandbox/{sandbox_id}/auth", response_model=GatewayAuth, responses=_NOT_FOUND, tags=["sandboxes"], summary="Gateway credentials for a sandbox")
    async def gateway_auth(sandbox_id: str, request: Request, tenant: str = tenant_dep) -> JSONResponse:
        rec = own(tenant, sandbox_id)
        return JSONResponse(service.gateway_auth(rec, str(request.base_url)).model_dump())

    @app.get(
        "/api/v1/sandbox/{sandbox_id}/error-context",
        response_model=ErrorContextOut,
        responses=_NOT_FOUND,
        tags=["sandboxes"],
        summary="Why a sandbox is not running",
    )
    async def error_context(sandbox_id: str, tenant: str = tenant_dep) -> JSONResponse:
        rec = own(tenant, sandbox_id)
        out = ErrorContextOut(status=rec.status, error_type=rec.error_type, error_message=rec.error_message)
        return JSONResponse(out.model_dump(by_alias=True))

    def egress_out(rec: Record) -> JSONResponse:
        e = rec.egress
        out = EgressPolicyOut(
            policy=e.policy, generation=e.generation, applied_generation=e.applied_generation,
            applied=e.applied_generation >= e.generation, error=e.error,
        )
        return JSONResponse(out.model_dump())

    @app.get(
        "/api/v1/sandbox/{sandbox_id}/egress-policy",
        response_model=EgressPolicyOut,
        responses=_NOT_FOUND,
        tags=["network"],
        summary="The sandbox's egress policy (desired and applied)",
    )
    async def get_egress(sandbox_id: str, tenant: str = tenant_dep) -> JSONResponse:
        return egress_out(own(tenant, sandbox_id))

    @app.put(
        "/api/v1/sandbox/{sandbox_id}/egress-policy",
        response_model=EgressPolicyOut,
        responses={**_NOT_FOUND, 409: {"description": "The sandbox has ended, or was made without network plumbing"}},
        tags=["network"],
        summary='Set the egress policy: {"allowlist": [...], "denylist": null} or the reverse',
    )
    async def put_egress(sandbox_id: str, body: EgressPolicyIn, tenant: str = tenant_dep) -> JSONResponse:
        rec = own(tenant, sandbox_id)
        try:
            policy = body.policy()
        except ValueError as exc:
            return JSONResponse({"detail": [{"type": "value_error", "loc": ["body"], "msg": str(exc)}]}, status_code=422)
        if rec.ended:
            return JSONResponse({"detail": f"sandbox {sandbox_id} is {rec.status}"}, status_code=409)
        try:
            await service.set_egress(rec, policy)
        except EgressUnavailable as exc:
            return JSONResponse({"detail": str(exc)}, status_code=409)
        return egress_out(rec)

    @app.get(
        "/api/v1/sandbox/{sandbox_id}/egress-log",
        response_model=EgressLogOut,
        responses={**_NOT_FOUND, 409: {"description": "The sandbox is not running"}},
        tags=["network"],
        summary="Connections the sandbox made or tried through its egress proxy (sandgym extension)",
    )
    async def egress_log(sandbox_id: str, tenant: str = tenant_dep) -> JSONResponse:
        rec = own(tenant, sandbox_id)
        sb = rec.sandbox
        if rec.status != "RUNNING" or sb is None:
            return JSONResponse({"detail": f"sandbox {sandbox_id} is {rec.status}"}, status_code=409)
        try:
            entries = await sb.egress_log()
        except Exception as exc:  # a provider that keeps none
            return JSONResponse({"detail": f"no egress log: {exc}"}, status_code=409)
        return JSONResponse(EgressLogOut(entries=[e.model_dump() for e in entries]).model_dump())

    @app.get(
        "/api/v1/user/whoami",
        response_model=WhoAmIOut,
        tags=["user"],
        summary="This token's user and limits (what `prime whoami` reads)",
    )
    async def whoami(tenant: str = tenant_dep, team_id: str | None = Query(None, alias="teamId")) -> WhoAmIOut:
        return WhoAmIOut(
            data=WhoAmI(
                id=tenant,
                name=tenant,
                slug=tenant,
                scope={"sandbox": {"read": True, "write": True}},
                key_limits=KeyLimits(max_concurrent_sandboxes=service.store.quota_of(tenant)),
            )
        )

    @app.get("/api/v1/sandbox/{sandbox_id}/logs", response_model=LogsOut, responses=_NOT_FOUND, tags=["sandboxes"], summary="Sandbox event log")
    async def logs(sandbox_id: str, tenant: str = tenant_dep) -> LogsOut:
        return LogsOut(logs="\n".join(own(tenant, sandbox_id).logs))

    # ---- gateway, health ---------------------------------------------------------------

    app.include_router(build_router(service))
    # Paths without parameters answer 405 for another method as usual; elsewhere a 405 only
    # means an optional endpoint collided with a parameterised one.
    static_paths = {getattr(r, "path", "") for r in app.routes if "{" not in getattr(r, "path", "{")}

    @app.get("/health", tags=["ops"], summary="Liveness (no auth)")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], summary="Counters (auth required)")
    async def metrics(tenant: str = tenant_dep) -> dict[str, object]:
        return service.metrics()

    return app
