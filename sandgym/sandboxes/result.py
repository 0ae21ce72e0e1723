"""ExecResult and sandbox metadata: what crosses the provider boundary."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

# Why a sandbox stopped (SandboxInfo.error_type, SandboxGoneError.reason):
# OOM_KILLED  its memory limit was hit and the kernel (runc: the whole box's main process;
#             gVisor: the whole sandbox) was killed;
# TIMEOUT     its ttl_s ran out (the provider ended it);
# EXITED      its main process ended on its own (exit code in error_message);
# REMOVED     removed by someone else (docker rm, prune) while in use;
# LOST        gone, and the provider cannot say why;
# DISK_FULL   not a death: a *running* sandbox whose writable space is full (writers get
#             ENOSPC; status stays "running").
# A command killed at its timeout exits with this code (timeout(1)'s), `timed_out` set.
TIMEOUT_EXIT = 124

ErrorType = Literal["OOM_KILLED", "TIMEOUT", "EXITED", "REMOVED", "LOST", "DISK_FULL"]
ERROR_TYPES: tuple[str, ...] = ("OOM_KILLED", "TIMEOUT", "EXITED", "REMOVED", "LOST", "DISK_FULL")


class ExecResult(BaseModel):
    """The outcome of one command. Raw bytes are kept; text views decode leniently.

    `truncated` is true when either stream went past the cap; the cap is `output_limit`.
    `exit_code` follows the shell convention: 128+N when killed by signal N, 137 on OOM/kill,
    TIMEOUT_EXIT (124) on timeout (with `timed_out` set).
    """

    model_config = ConfigDict(frozen=True)

    exit_code: int
    stdout_bytes: bytes = Field(b"", exclude=True, repr=False)
    stderr_bytes: bytes = Field(b"", exclude=True, repr=False)
    duration_s: float = 0.0
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    output_limit: int | None = None

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form; mypy rejects decorators over @property
    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form; mypy rejects decorators over @property
    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class SandboxInfo(BaseModel):
    """What `ls`/`prune`/`Sandbox.info()` see of a sandbox, whichever provider made it.

    `status`: "running", "created", "exited" (still listed by the engine), or "gone" (no
    longer exists; `Sandbox.info()` / `DockerProvider.inspect` remember why). `error_type`
    (see ErrorType) and `error_message` say why a sandbox that is not running stopped, and
    flag DISK_FULL on a running one. `disk_used_mb`/`disk_mb`: its writable space, where
    the provider can measure it.
    """

    id: str
    provider: str
    image: str = ""
    status: str = "running"
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: float | None = None
    error_type: ErrorType | None = None
    error_message: str | None = None
    exit_code: int | None = None
    disk_used_mb: float | None = None
    disk_mb: float | None = None

    @property
    def owner(self) -> str | None:
        return self.labels.get("sandgym.owner")

    @property
    def pid(self) -> int | None:
        p = self.labels.get("sandgym.pid")
        return int(p) if p and p.isdigit() else None


class EgressLogEntry(BaseModel):
    """One connection (or request) a sandbox made through its egress proxy."""

    model_config = ConfigDict(frozen=True)

    time: float  # epoch seconds, when the proxy finished with it
    sandbox: str  # the sandbox id
    method: str  # CONNECT for TLS tunnels, else the HTTP method
    host: str
    port: int
    allowed: bool
    status: int  # HTTP status the proxy answered (0 when none)
    bytes: int  # bytes sent to the sandbox
    reason: str = ""  # why it was refused
