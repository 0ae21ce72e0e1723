"""SandboxSpec: what a sandbox is, validated before anything is created."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .egress.rules import parse_entries

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


Profile = Literal["strict", "vm"]
PullPolicy = Literal["missing", "never", "always"]


class EgressPolicy(BaseModel):
    """Where a sandbox may open connections, enforced outside it (docker: a host-side proxy).

    `allow` entries: `*` (any public destination), host names (`pypi.org`, on ports 80/443),
    leftmost wildcards (`*.pythonhosted.org`), `host:port` / `host:lo-hi`, IPv4 addresses and
    CIDRs (any port unless given), and `host.sandgym.internal[:PORT]` for the engine host's
    loopback services the operator exposes. `deny` uses the same entries and wins over
    `allow`. `EgressPolicy(allow=())` allows nothing yet keeps the egress plumbing, so
    `Sandbox.set_egress` can open it later. See sandgym/sandboxes/egress/rules.py.
    Bad entries raise ValueError naming the entry.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: tuple[str, ...]
    deny: tuple[str, ...] = ()

    @field_validator("allow", "deny", mode="before")
    @classmethod
    def _entries(cls, v: Any, info: Any) -> tuple[str, ...]:
        if v is None:
            return ()
        return tuple(r.text for r in parse_entries(v, info.field_name))

    @classmethod
    def anything(cls) -> EgressPolicy:
        """Any public destination (what `network=True` means)."""
        return cls(allow=("*",))

    @classmethod
    def nothing(cls) -> EgressPolicy:
        """No destination, but changeable later with `set_egress`."""
        return cls(allow=())


class SandboxSpec(BaseModel):
    """An immutable description of a sandbox. Defaults are safe for untrusted code.

    `profile`:
    - `strict` (default; scoring untrusted code): the image's non-root user (uid 1000 when
      the image has none), a read-only root file system, and `disk_mb` of writable space
      for `workdir` and /tmp together (docker: a per-sandbox ext4 file system when the
      engine has the sandgym runtimes, else two tmpfs mounts of `disk_mb` each, which count
      against memory).
    - `vm` (what Prime/E2B users expect): root by default (`user` may name another), a
      writable root file system whose writes are capped at `disk_mb` (ENOSPC past it, not
      charged to memory), /work and /app present. The docker provider runs it under gVisor
      (runtime `runsc`) and refuses it without, unless the operator opted out visibly
      (`SANDGYM_ALLOW_VM_WITHOUT_GVISOR=1` or `DockerProvider(allow_vm_without_gvisor=True)`).

    `egress`: None (default) = no network at all. An `EgressPolicy` opens the listed
    destinations through the provider's egress proxy (HTTP(S)_PROXY inside; CONNECT for
    TLS). `network=True` is shorthand for `egress=EgressPolicy.anything()`; `network` always
    mirrors `egress is not None` (read `egress`). `image_pull`: pull the image from its
    registry when it is `missing` locally (default), `never`, or `always`.
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
    network: bool = Field(False, description="Shorthand: True = egress to anything public. Mirrors `egress`.")
    profile: Profile = Field("strict", description="Isolation profile: strict (default) or vm.")
    egress: EgressPolicy | None = Field(None, description="Outbound network policy; None = no network.")
    image_pull: PullPolicy = Field("missing", description="Pull the image when missing|never|always.")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = Field("/workspace", description="Absolute working directory.")
    user: str | None = Field(None, description="User to run as; None = image's non-root default.")
    ttl_s: Annotated[float | None, Field(gt=0, description="Lifetime before reaping.")] = 3600.0
    exec_timeout_s: Annotated[float, Field(gt=0, le=86400, description="Default exec timeout.")] = 60.0
    output_limit_bytes: Annotated[int, Field(ge=1024, le=1 << 30, description="Per-stream cap.")] = 1 << 20
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _network_shorthand(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        network, egress = data.get("network"), data.get("egress")
        if network is True and egress is None:
            data["egress"] = EgressPolicy.anything()
        elif network is False and egress is not None:
            raise ValueError("network=False contradicts an egress policy; leave network unset (it mirrors egress)")
        data["network"] = data.get("egress") is not None
        return data

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
