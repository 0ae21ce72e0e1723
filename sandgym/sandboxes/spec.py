"""SandboxSpec: what a sandbox is, validated before anything is created."""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_IMAGE = "sandgym/python:latest"

# Label keys every provider stamps on what it creates, so `prune` can find orphans.
LABEL_OWNER = "sandgym.owner"
LABEL_PID = "sandgym.pid"
LABEL_HOST = "sandgym.host"
LABEL_SPEC = "sandgym.spec"

_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


def host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class SandboxSpec(BaseModel):
    """An immutable description of a sandbox. Defaults are safe for untrusted code.

    `network` is off by default; `user` is the image's non-root `sandbox` user; the root
    file system is read-only and `workdir` and /tmp are size-limited tmpfs mounts of
    `disk_mb` each (docker provider).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(DEFAULT_IMAGE, min_length=1, description="Image name (docker/prime).")
    cpu: Annotated[float, Field(gt=0, description="CPU cores (fractional allowed).")] = 1.0
    memory_mb: Annotated[int, Field(ge=16, le=1024 * 1024, description="Memory limit, MiB.")] = 1024
    # Docker backs the workdir and /tmp with tmpfs (disk_mb each), which is charged to the
    # memory limit: keep 2 * disk_mb well under memory_mb or a full disk starves processes.
    disk_mb: Annotated[int, Field(ge=1, le=1024 * 1024, description="Writable space, MiB.")] = 256
    pids: Annotated[int, Field(ge=8, le=1_000_000, description="Max processes.")] = 256
    gpus: Annotated[int, Field(ge=0, le=64, description="GPUs to expose.")] = 0
    network: bool = Field(False, description="Allow network access (off by default).")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = Field("/workspace", description="Absolute working directory.")
    user: str | None = Field(None, description="User to run as; None = image's non-root default.")
    ttl_s: Annotated[float | None, Field(gt=0, description="Lifetime before reaping.")] = 3600.0
    exec_timeout_s: Annotated[float, Field(gt=0, le=86400, description="Default exec timeout.")] = 60.0
    output_limit_bytes: Annotated[int, Field(ge=1024, le=1 << 30, description="Per-stream cap.")] = 1 << 20
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("cpu")
    @classmethod
    def _cpu_fits_host(cls, v: float) -> float:
        n = host_cpus()
        if v > n:
            raise ValueError(f"cpu={v} is more than this host has; allowed range: (0, {n}]")
        return v

    @field_validator("workdir")
    @classmethod
    def _abs_workdir(cls, v: str) -> str:
        if not v.startswith("/") or "\x00" in v:
            raise ValueError(f"workdir must be an absolute path, got {v!r}")
        return v.rstrip("/") or "/"

    @field_validator("labels")
    @classmethod
    def _label_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _LABEL_KEY.match(k) or k.startswith("sandgym."):
                raise ValueError(f"label key {k!r} is invalid or reserved (sandgym.* is ours)")
        return v

    @field_validator("env")
    @classmethod
    def _env_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise ValueError(f"env key {k!r} is not a valid variable name")
        return v

    def key(self) -> str:
        """A stable key for warm pools: equal specs share a pool."""
        return self.model_dump_json()
