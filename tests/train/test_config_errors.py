"""Training configs that cannot work stop while the config is read, before any model is
built, with one line naming the key (what `sandgym train` prints: cli.errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandgym.cli.errors import user_error_message
from sandgym.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "toy.toml"

# (overrides on examples/toy.toml, the key the one line must name first, more it must say)
CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"loss.bogus": 1}, "loss.bogus", "Extra inputs are not permitted"),
    ({"distributed.nprocs": 2}, "distributed.nprocs", "Extra inputs are not permitted"),
    ({"optim.async_level": 1, "backend.share_weights": True}, "backend.share_weights", "optim.async_level = 1"),
    ({"optim.async_level": 1, "backend.kind": "vllm", "backend.sleep_during_training": True}, "backend.sleep_during_training", "cannot generate"),
    ({"optim.async_level": 3}, "optim.max_off_policy_steps", "at least optim.async_level (3)"),
    ({"distributed.nproc": 2, "backend.share_weights": True}, "backend.share_weights", "distributed.nproc = 2"),
    ({"backend.kind": "vllm", "backend.tensor_parallel_size": 4, "distributed.nproc": 2}, "backend.tensor_parallel_size", "at most distributed.nproc (2)"),
    ({"backend.kind": "hf", "backend.tensor_parallel_size": 2, "distributed.nproc": 2}, "backend.tensor_parallel_size", "needs backend.kind = 'vllm'"),
    ({"backend.kind": "vllm", "model.device": "cpu"}, "backend.kind", "needs a CUDA device"),
    ({"distributed.backend": "nccl", "model.device": "cpu"}, "distributed.backend", "needs CUDA"),
    ({"loss.policy_loss": "gspo", "loss.normalization": "token"}, "loss.normalization", "'gspo'"),
    ({"loss.policy_loss": "gspo", "loss.normalization": "sequence", "loss.is_correction": "tis"}, "loss.is_level", "sequence-level ratio"),
    ({"loss.is_correction": "mis", "loss.is_low": 3.0}, "loss.is_low", "below loss.is_high"),
    ({"rollout.max_groups_factor": 0.5}, "rollout.max_groups_factor", "greater than or equal to 1"),
]


@pytest.mark.parametrize(("overrides", "key", "says"), CASES, ids=[c[1] for c in CASES])
def test_impossible_config_is_one_line_naming_the_key(overrides: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(Exception) as info:
        TrainConfig.from_toml(TOY, overrides)
    line = user_error_message(info.value)
    assert line is not None, f"not reported as the user's error: {info.value!r}"
    line = " ".join(line.split())
    assert key in line and says in line, line
    # The key is named before anything else is said.
    first = line.split(": ", 1)[1] if line.startswith("invalid ") else line
    assert first.startswith(key), line


def test_the_same_options_apart_are_fine() -> None:
    for overrides in (
        {"optim.async_level": 1},  # the backend serves a copy; vLLM would stay awake
        {"optim.async_level": 2, "optim.max_off_policy_steps": 2},
        {"distributed.nproc": 2},
        {"loss.policy_loss": "gspo", "loss.normalization": "sequence", "loss.is_correction": "tis", "loss.is_level": "geometric"},
        {"loss.policy_loss": "cispo", "loss.is_correction": "mis", "loss.is_low": 0.5, "loss.is_high": 5.0},
    ):
        cfg = TrainConfig.from_toml(TOY, overrides)
        assert cfg.hf_share_weights() is (cfg.optim.async_level == 0 and cfg.distributed.nproc == 1)
        assert cfg.vllm_sleeps() is (cfg.optim.async_level == 0)
