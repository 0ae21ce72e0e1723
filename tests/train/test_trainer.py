"""The GRPO loop end to end on CPU: a tiny random Qwen2-shaped model, the toy multi-turn
environment, generation through the built-in transformers backend's OpenAI-compatible server."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
from typer.testing import CliRunner

from sandgym.train.config import TrainConfig
from sandgym.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp: Path, **over: dict) -> TrainConfig:
    data = {
        "backend": {"kind": "hf"},
        "rollout": {"prompts_per_step": 4, "group_size": 8, "max_tokens": 8},
        "optim": {"steps": 16, "lr": 1e-2, "micro_batch_tokens": 2048, "seed": 0},
        "output": {"dir": str(tmp), "resume": True, "plot": True, "checkpoint_every": 0},
    }
    for k, v in over.items():
        data.setdefault(k, {}).update(v)
    return TrainConfig.model_validate(data)


def test_cpu_learning_reward_rises(tmp_path: Path) -> None:
    hist = Trainer(_cfg(tmp_path)).run()
    rewards = [m["reward_mean"] for m in hist]
    first, last = statistics.fmean(rewards[:4]), statistics.fmean(rewards[-4:])
    # Uniform random policy: ~26/259 = 0.10. Seen: first ~0.11, last ~0.9 (lr 1e-2, 16 steps).
    assert last > first + 0.25, rewards
    assert last > 0.4, rewards
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [int(m["step"]) for m in lines] == list(range(1, 17))
    for key in ("reward_mean", "loss", "entropy", "clip_frac", "train_tokens_per_s", "step_s", "generate_s", "inference_logprob_abs_diff"):
        assert key in lines[-1], key
    # The server's logprobs and the trainer's recomputation agree (same weights, float32).
    assert max(m["inference_logprob_abs_diff"] for m in lines) < 1e-3
    png = tmp_path / "reward_loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checkpoint_and_resume(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, optim={"steps": 2}, output={"checkpoint_every": 1})
    t1 = Trainer(cfg)
    t1.run()
    ck = t1.latest_checkpoint()
    assert ck is not None and ck.name == "step_000002"
    saved = torch.load(ck / "trainer_state.pt", weights_only=False)
    assert saved["step"] == 2 and saved["data_position"] == 8

    cfg2 = _cfg(tmp_path, optim={"steps": 4}, output={"checkpoint_every": 1})
    t2 = Trainer(cfg2)
    t2.load_checkpoint(t2.latest_checkpoint())  # what run() does first; checked before training
    assert t2.step == 2 and t2.data_position == 8
    for (n, a), b in zip(t2.model.state_dict().items(), saved["model"].values()):
        assert torch.equal(a, b), n
    # The optimizer state is saved by parameter name (the same on any number of processes).
    names = [n for n, p in t2.model.named_parameters() if p.requires_grad]
    assert sorted(saved["optimizer"]["state"]) == sorted(names)
    st_opt = t2.policy.optimizer.state_dict()["state"]
    for i, n in enumerate(names):
        v = saved["optimizer"]["state"][n]
        assert torch.equal(st_opt[i]["exp_avg"], v["exp_avg"]) and torch.equal(st_opt[i]["exp_avg_sq"], v["exp_avg_sq"])
    assert t2.policy.scheduler.last_epoch == saved["scheduler"]["last_epoch"]
    hist = Trainer(cfg2).run()  # a fresh trainer resumes by itself
    assert [int(m["step"]) for m in hist] == [3, 4]
    assert [int(m["data_position"]) for m in hist] == [12, 16]
    steps = [int(json.loads(x)["step"]) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    # keep_checkpoints = 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000003", "step_000004"]


def test_overlap_kl_tis_iterations_checkpointing(tmp_path: Path) -> None:
    """Off-policy options together: generation of step n+1 overlaps training of step n (a
    separate weight copy in the backend), KL to a frozen reference, TIS, two optimizer passes
    per batch (so the ratio moves and clipping can act), gradient checkpointing."""
    cfg = _cfg(
        tmp_path,
        optim={"steps": 3, "async_level": 1, "num_iterations": 2},
        loss={"kl_beta": 0.05, "is_correction": "tis", "normalization": "sequence"},
        model={"gradient_checkpointing": True},
        output={"plot": False},
    )
    tr = Trainer(cfg)
    assert tr.model.is_gradient_checkpointing
    hist = tr.run()
    assert hist[0]["staleness"] == 0.0  # nothing was trained before step 1
    assert all(m["staleness_max"] <= 1 for m in hist) and any(m["staleness"] > 0 for m in hist[1:])
    assert all("kl" in m and m["kl"] >= 0 for m in hist)
    assert hist[-1]["kl"] > 0  # the policy moved away from the reference
    assert all(0.0 < m["is_weight_mean"] <= 2.0 for m in hist)
    assert all(m["mismatch_kl"] >= 0 for m in hist)
    assert any(m["ratio_mean"] != 1.0 for m in hist)  # second pass is off-policy


def test_cli_train_toy_config(tmp_path: Path) -> None:
    from sandgym.cli import app

    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(ROOT / "examples" / "toy.toml"), "--steps", "2", "--output", str(out), "--no-resume"])
    assert res.exit_code == 0, res.output
    assert "step    1  reward" in res.output and "step    2  reward" in res.output
    assert "attention=sdpa" in res.output
    assert (out / "metrics.jsonl").exists() and (out / "reward_loss.png").exists()
    assert (out / "checkpoints" / "step_000002" / "trainer_state.pt").exists()
    # The same line again (with --nproc 2, as a newcomer tries next) finds the finished run:
    # it says so, and trains nothing.
    metrics = (out / "metrics.jsonl").read_text()
    res = CliRunner().invoke(app, ["train", str(ROOT / "examples" / "toy.toml"), "--steps", "2", "--output", str(out), "--nproc", "2"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert f"{out} is a finished run (step 2 of 2)" in said and "--no-resume" in said and "--output DIR" in said
    assert (out / "metrics.jsonl").read_text() == metrics


def test_external_inference_server_is_refused_when_the_config_is_read(tmp_path: Path) -> None:
    import pytest
    from pydantic import ValidationError

    toml = tmp_path / "external.toml"
    toml.write_text('[backend]\nkind = "vllm"\nbase_url = "http://127.0.0.1:8000/v1"\n')
    with pytest.raises(ValidationError, match="backend.base_url: an external inference server is not supported yet"):
        TrainConfig.from_toml(toml)
