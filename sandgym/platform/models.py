"""Wire models of the prime-sandboxes 0.5.1 control plane (requests snake_case, responses
camelCase as the SDK's `Sandbox` model reads them). Checked against the SDK's models.py."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Status = Literal["PENDING", "PROVISIONING", "RUNNING", "PAUSED", "ERROR", "TERMINATED", "TIMEOUT"]
STATUSES: tuple[str, ...] = get_args(Status)
ENDED = ("ERROR", "TERMINATED", "TIMEOUT")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
    network_allowlist: list[str] | None = None
    network_denylist: list[str] | None = None
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
    def _env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for k, val in (v or {}).items():
            if not _ENV_KEY.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
            if "\x00" in val:
                raise ValueError(f"value of {k!r} contains a NUL byte")
        return v


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
    status: str
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
    gateway_auth: GatewayAuth | None = Field(None, alias="gatewayAuth")


class SandboxListOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    sandboxes: list[SandboxOut]
    total: int
    page: int
    per_page: int = Field(alias="perPage")
    has_next: bool = Field(alias="hasNext")


class BulkDeleteBody(BaseModel):
    """Give `sandbox_ids` or `labels` (sandboxes carrying all of them), or both."""

    model_config = ConfigDict(extra="ignore")

    sandbox_ids: list[str] | None = Field(None, max_length=1000)
    labels: list[str] | None = Field(None, max_length=64)
    team_id: str | None = None
    user_id: str | None = None
    all_users: bool = False

    @model_validator(mode="after")
    def _one_selector(self) -> "BulkDeleteBody":
        if not self.sandbox_ids and not self.labels:
            raise ValueError("give sandbox_ids or labels")
        return self


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
