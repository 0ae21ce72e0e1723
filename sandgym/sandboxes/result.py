"""ExecResult and sandbox metadata: what crosses the provider boundary."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field


class ExecResult(BaseModel):
    """The outcome of one command. Raw bytes are kept; text views decode leniently.

    `truncated` is true when either stream went past the cap; the cap is `output_limit`.
    `exit_code` follows the shell convention: 128+N when killed by signal N, 137 on OOM/kill,
    124 on timeout (with `timed_out` set).
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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class SandboxInfo(BaseModel):
    """What `ls`/`prune` see of a sandbox, whichever provider made it."""

    id: str
    provider: str
    image: str = ""
    status: str = "running"
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: float | None = None

    @property
    def owner(self) -> str | None:
        return self.labels.get("sandgym.owner")

    @property
    def pid(self) -> int | None:
        p = self.labels.get("sandgym.pid")
        return int(p) if p and p.isdigit() else None
