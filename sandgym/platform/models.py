"""Wire models of the prime-sandboxes 0.5.1 control plane (requests snake_case, responses
camelCase as the SDK's `Sandbox` model reads them). Checked against the SDK's models.py."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .egress import WirePolicy, check_list

Status = Literal["PENDING", "PROVISIONING", "RUNNING", "PAUSED", "ERROR", "TERMINATED", "TIMEOUT"]
STATUSES: tuple[str, ...] = get_args(Status)
ENDED = ("ERROR", "TERMINATED", "TIMEOUT")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Environment limits, checked before anything is made. Linux refuses an exec whose single
# "KEY=value" string passes MAX_ARG_STRLEN (128 KiB) or whose environment and arguments
# together pass ARG_MAX (2 MiB with the default 8 MiB stack): keep half of that for argv.
MAX_ENV_VARS = 4096
MAX_ENV_ENTRY_BYTES = 128 * 1024 - 1
MAX_ENV_TOTAL_BYTES = 1 << 20
MIN_MEMORY_MB = 16


def check_env(name: str, env: dict[str, str]) -> None:
    """ValueError naming the limit when `env` cannot be passed to a process."""
    if len(env) > MAX_ENV_VARS:
        raise ValueError(f"{name} has {len(env)} variables; at most {MAX_ENV_VARS} are allowed")
    total = 0
    for k, v in env.items():
        if not _ENV_KEY.match(k):
            raise ValueError(f"{k[:64]!r} is not a valid environment variable name")
        if "\x00" in v:
            raise ValueError(f"value of {k[:64]!r} contains a NUL byte")
        size = len(k.encode()) + 1 + len(v.encode())
        if size > MAX_ENV_ENTRY_BYTES:
            raise ValueError(
                f"{name}[{k[:64]!r}] is {size} bytes as KEY=value; at most {MAX_ENV_ENTRY_BYTES} bytes per variable"
            )
        total += size + 1
    if total > MAX_ENV_TOTAL_BYTES:
        raise ValueError(f"{name} totals {total} bytes; at most {MAX_ENV_TOTAL_BYTES} bytes in all")


class StartCommand(BaseModel):
    model_config = ConfigDict(extra="forbid")
    executable: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)


class VolumeMount(BaseModel):
    name: str
    mount_path: str
    read_only: bool = False


class CreateSandboxBody(BaseModel):
    """`CreateSandboxRequest` as the SDK dumps it (exclude_none, plus `vm` and
    `idempotency_key`). Fields this server cannot honour are refused with 422, by name."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=256)
    docker_image: str = Field(min_length=1, max_length=512, description="Image on the sandbox host's engine")
    checkpoint_id: str | None = None
    arch: Literal["amd64", "arm64"] | None = None
    start_command: StartCommand | None = None
    cpu_cores: float = Field(1.0, gt=0, le=1024)
    memory_gb: float = Field(1.0, gt=0, le=1024)
    disk_size_gb: float | None = Field(None, gt=0, le=1024)
    gpu_count: int = Field(0, ge=0, le=64)
    gpu_type: str | None = None
    network_allowlist: list[str] | None = Field(None, description="Only these destinations (`[]`: no network)")
    network_denylist: list[str] | None = Field(None, description="Everything but these (`[]`: unrestricted)")
    network_access: bool | None = Field(None, description="Older field: true = unrestricted, false = no network")
    timeout_minutes: int = Field(60, ge=-1, le=10_000_000)
    idle_timeout_minutes: int | None = Field(None, ge=1, le=10_000_000)
    environment_vars: dict[str, str] | None = None
    secrets: dict[str, str] | None = None
    labels: list[str] = Field(default_factory=list, max_length=64)
    team_id: str | None = None
    region: str | None = None
    advanced_configs: dict[str, Any] | None = None
    idempotency_key: str | None = Field(None, max_length=256)
    vm: bool = True
    volumes: list[VolumeMount] | None = None

    @field_validator("timeout_minutes")
    @classmethod
    def _timeout(cls, v: int) -> int:
        if v == 0:
            raise ValueError("timeout_minutes must be -1 (no timeout) or at least 1")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        for label in v:
            if not label or len(label) > 256 or "\x00" in label:
                raise ValueError(f"label {label!r} must be 1-256 characters without NUL")
        return v

    @field_validator("environment_vars", "secrets")
    @classmethod
    def _env(cls, v: dict[str, str] | None, info: Any) -> dict[str, str] | None:
        if v:
            check_env(info.field_name, v)
        return v

    @field_validator("network_allowlist", "network_denylist")
    @classmethod
    def _egress(cls, v: list[str] | None, info: Any) -> list[str] | None:
        if v is not None and [e.strip() for e in v] == ["*"]:
            return ["*"]  # "everything" / "nothing": WirePolicy.parse maps it
        return check_list(info.field_name, v)

    @model_validator(mode="after")
    def _whole(self) -> CreateSandboxBody:
        check_env("environment_vars and secrets", {**(self.environment_vars or {}), **(self.secrets or {})})
        given = [n for n in ("network_allowlist", "network_denylist", "network_access") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are mutually exclusive; give at most one")
        return self

    def requested_policy(self) -> WirePolicy | None:
        """The egress policy the request names, or None (then the server's default applies)."""
        if self.network_access is not None:
            return WirePolicy.unrestricted() if self.network_access else WirePolicy.blocked()
        if self.network_allowlist is None and self.network_denylist is None:
            return None
        return WirePolicy.parse(self.network_allowlist, self.network_denylist, where="network_")


class GatewayAuth(BaseModel):
    gateway_url: str
    user_ns: str
    job_id: str
    token: str
    expires_at: str


class SandboxOut(BaseModel):
    """The SDK's `Sandbox` (camelCase aliases on the wire)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    id: str
    name: str
    docker_image: str = Field(alias="dockerImage")
    start_command: StartCommand | None = Field(None, alias="startCommand")
    cpu_cores: float = Field(alias="cpuCores")
    memory_gb: float = Field(alias="memoryGB")
    disk_size_gb: float = Field(alias="diskSizeGB")
    disk_mount_path: str = Field(alias="diskMountPath")
    gpu_count: int = Field(0, alias="gpuCount")
    gpu_type: str | None = Field(None, alias="gpuType")
    vm: bool = True
    network_allowlist: list[str] | None = Field(None, alias="networkAllowlist", description="The effective policy")
    network_denylist: list[str] | None = Field(None, alias="networkDenylist", description="The effective policy")
    status: str
    waiting_reason: str | None = Field(None, alias="waitingReason", description="Why a PENDING sandbox waits")
    timeout_minutes: int = Field(alias="timeoutMinutes")
    idle_timeout_minutes: int | None = Field(None, alias="idleTimeoutMinutes")
    termination_reason: str | None = Field(None, alias="terminationReason")
    environment_vars: dict[str, str] | None = Field(None, alias="environmentVars")
    labels: list[str] = Field(default_factory=list)
    created_at: datetime = Field(alias="createdAt")
    updated_at: datetime = Field(alias="updatedAt")
    started_at: datetime | None = Field(None, alias="startedAt")
    terminated_at: datetime | None = Field(None, alias="terminatedAt")
    error_type: str | None = Field(None, alias="errorType")
    error_message: str | None = Field(None, alias="errorMessage")
    user_id: str | None = Field(None, alias="userId")
    team_id: str | None = Field(None, alias="teamId")
    region: str | None = None
    advanced_configs: dict[str, Any] | None = Field(None, alias="advancedConfigs")
    gateway_auth: GatewayAuth | None = Field(None, alias="gatewayAuth")


class SandboxListOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    sandboxes: list[SandboxOut]
    total: int
    page: int
    per_page: int = Field(alias="perPage")
    has_next: bool = Field(alias="hasNext")


class BulkDeleteBody(BaseModel):
    """Give `sandbox_ids` or `labels` (sandboxes carrying all of them), or both; or only
    `user_id` / `all_users` (what `prime sandbox delete --all` sends): every live sandbox of
    this token. A token is one user, so `all_users` reaches no further."""

    model_config = ConfigDict(extra="ignore")

    sandbox_ids: list[str] | None = Field(None, max_length=1000)
    labels: list[str] | None = Field(None, max_length=64)
    team_id: str | None = None
    user_id: str | None = None
    all_users: bool = False

    @model_validator(mode="after")
    def _one_selector(self) -> BulkDeleteBody:
        if not self.sandbox_ids and not self.labels and self.user_id is None and not self.all_users:
            raise ValueError("give sandbox_ids, labels, user_id or all_users")
        return self

    @property
    def everything(self) -> bool:
        """No ids or labels: all of the caller's live sandboxes."""
        return not self.sandbox_ids and not self.labels


class BulkDeleteOut(BaseModel):
    succeeded: list[str]
    failed: list[dict[str, str]]
    message: str


class StatusBatchBody(BaseModel):
    sandbox_ids: list[str] = Field(min_length=1, max_length=100)


class StatusSnapshot(BaseModel):
    sandbox_id: str
    status: str
    error_type: str | None = None
    error_message: str | None = None
    waiting_reason: str | None = None


class StatusError(BaseModel):
    sandbox_id: str
    code: Literal["NOT_FOUND", "FORBIDDEN", "MANAGED"]
    message: str


class StatusBatchOut(BaseModel):
    statuses: list[StatusSnapshot]
    errors: list[StatusError]


class ErrorContextOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    status: str
    error_type: str | None = Field(None, alias="errorType")
    error_message: str | None = Field(None, alias="errorMessage")


class LogsOut(BaseModel):
    logs: str


class DeleteOut(BaseModel):
    id: str
    status: str


class UploadOut(BaseModel):
    success: bool
    path: str
    size: int
    timestamp: datetime


class ReadFileOut(BaseModel):
    content: str
    size: int
    total_size: int | None = None
    offset: int | None = None
    truncated: bool | None = None


class EgressPolicyIn(BaseModel):
    """`PUT /sandbox/{id}/egress-policy`: exactly one list non-null. `{"allowlist": null,
    "denylist": []}` allows everything, `{"allowlist": [], "denylist": null}` nothing."""

    model_config = ConfigDict(extra="ignore")

    allowlist: list[str] | None = None
    denylist: list[str] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EgressPolicyIn:
        if (self.allowlist is None) == (self.denylist is None):
            raise ValueError("give exactly one of allowlist and denylist (the other null)")
        return self

    def policy(self) -> WirePolicy:
        return WirePolicy.parse(self.allowlist, self.denylist)


class EgressPolicyOut(BaseModel):
    """prime-sandboxes' `EgressPolicyStatus`."""

    policy: WirePolicy
    generation: int
    applied_generation: int
    applied: bool
    error: str | None = Field(None, description="Why the last policy could not be applied")


class EgressLogOut(BaseModel):
    """`entries`: sandgym.sandboxes.result.EgressLogEntry as dicts (time, method, host, port,
    allowed, status, bytes, reason), oldest first."""

    entries: list[dict[str, Any]]


class KeyLimits(BaseModel):
    max_concurrent_sandboxes: int
    max_sandbox_creations_per_hour: int | None = None
    max_sandbox_cpu_cores: float | None = None
    max_sandbox_gpu_count: int | None = None
    max_concurrent_tunnels: int | None = 0


class WhoAmI(BaseModel):
    id: str
    email: str | None = None
    name: str
    slug: str
    scope: dict[str, dict[str, bool] | None] = Field(default_factory=dict)
    account_limits: dict[str, Any] | None = None
    key_limits: KeyLimits


class WhoAmIOut(BaseModel):
    data: WhoAmI
