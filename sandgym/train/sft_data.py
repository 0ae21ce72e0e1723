"""What `sandgym sft` reads: its config (the TOML's sections; sandgym.train.sft trains with
it) and the rollout records it trains on. No torch here, so bad input is refused at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from sandgym.errors import UserError
from sandgym.train.config import RunConfig, Strict


class SFTDataConfig(Strict):
    # Record files (results.jsonl from `sandgym eval`), or run folders holding one.
    paths: list[str] = Field(min_length=1)
    min_reward: float = 1.0  # keep records that scored at least this (and did not fail)
    max_records: int | None = Field(None, gt=0)

    @field_validator("paths", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class SFTOptimConfig(Strict):
    steps: int = Field(100, gt=0)
    batch_size: int = Field(16, gt=0)  # sequences per optimizer step
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"  # after warmup (see OptimConfig)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(8192, gt=0)
    seed: int = 0


class SFTOutputConfig(Strict):
    dir: str = "runs/sft"
    keep_checkpoints: int = Field(1, gt=0)


class SFTConfig(RunConfig):
    data: SFTDataConfig
    optim: SFTOptimConfig = Field(default_factory=SFTOptimConfig)
    output: SFTOutputConfig = Field(default_factory=SFTOutputConfig)

    def resolve_paths(self, base: Path) -> None:
        super().resolve_paths(base)
        self.data.paths = [str(q if Path(q).is_absolute() else (base / q).resolve()) for q in self.data.paths]


def read_records(cfg: SFTDataConfig) -> list[dict[str, Any]]:
    """The records to train on, in file order."""
    out: list[dict[str, Any]] = []
    for raw in cfg.paths:
        p = Path(raw)
        if p.is_dir():
            p = p / "results.jsonl"
        if not p.is_file():
            raise UserError(f"data.paths: no records file at {p}")
        records: list[dict[str, Any]] = []
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{p}:{n}: not a JSON record: {exc}") from exc
            if not isinstance(rec, dict) or "turns" not in rec:
                raise UserError(f"{p}:{n}: not a rollout record (no turns); give results.jsonl from `sandgym eval`")
            if rec.get("error") or float(rec.get("reward") or 0.0) < cfg.min_reward or not rec["turns"]:
                continue
            records.append(rec)
        # `sandgym eval` writes records as rollouts finish, so a file's order depends on
        # timing: train in task order, or the same seed would give another model per recording.
        records.sort(key=lambda r: (_int(r.get("example_id")), _int(r.get("rollout_index"))))
        out.extend(records)
    if cfg.max_records is not None:
        out = out[: cfg.max_records]
    if not out:
        raise UserError(f"data: no records without errors and with reward >= {cfg.min_reward} in {', '.join(cfg.paths)}")
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) else -1
