"""FSDP2 data parallelism on CPU (gloo): 2 processes started by torchrun give the same loss
and the same updated weights as 1 process on the same global batch (fsdp_step_worker.py:
several micro-batches per rank, a different number on each rank, two optimizer passes per
batch, a KL reference model sharded too, TIS; and GSPO, whose sequence-level ratio needs the
step's global sequence indices). Then `sandgym train --nproc 2` end to end, and a resume of
its checkpoint by one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fsdp_step_worker.py")
LOSSES = [
    {"kl_beta": 0.1, "is_correction": "tis", "normalization": "token"},
    {"policy_loss": "gspo", "normalization": "sequence", "gspo_eps_low": 0.3, "gspo_eps_high": 0.4},
]


def _in_process(out: Path, losses: str) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fsdp_step_worker", WORKER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    threads = torch.get_num_threads()
    try:
        mod.main(str(out), losses)
    finally:
        torch.set_num_threads(threads)
    return torch.load(out, weights_only=False)


def _run(cmd: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return torch.load(out, weights_only=False)


def test_two_processes_match_one_on_the_same_global_batch(tmp_path: Path) -> None:
    from sandgym.train.launch import free_port

    losses = json.dumps(LOSSES)
    one = _in_process(tmp_path / "one.pt", losses)
    two = _run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), str(WORKER), str(tmp_path / "two.pt"), losses],
        tmp_path / "two.pt",
    )
    assert one["world_size"] == 1 and two["world_size"] == 2
    for a, b in zip(one["results"], two["results"]):
        for step, (ma, mb) in enumerate(zip(a["metrics"], b["metrics"])):
            print(f"{a['loss']} step {step + 1}: loss {ma['loss']:.8f} (1 proc) {mb['loss']:.8f} (2 procs); "
                  f"grad norm {ma['grad_norm']:.6f} / {mb['grad_norm']:.6f}")
            assert mb["loss_tokens"] == ma["loss_tokens"] and mb["train_tokens"] == ma["train_tokens"]
            assert mb["loss"] == pytest.approx(ma["loss"], rel=1e-5, abs=1e-7)
            assert mb["grad_norm"] == pytest.approx(ma["grad_norm"], rel=1e-4)
            assert mb["clip_frac"] == pytest.approx(ma["clip_frac"], abs=1e-9)
            assert ma["grad_norm"] > 0  # not everything clipped: the gradient paths are compared
        assert a["state"].keys() == b["state"].keys()
        diff = max(float((a["state"][k] - b["state"][k]).abs().max()) for k in a["state"])
        print(f"{a['loss']}: max |w(1 proc) - w(2 procs)| after 2 steps = {diff:.3g}")
        assert diff < 1e-4, diff
    # The runs trained (the weights moved by far more than the tolerance).
    from sandgym.models.tiny import tiny_qwen2

    init = tiny_qwen2(seed=0).state_dict()
    moved = max(float((one["results"][0]["state"][k] - init[k]).abs().max()) for k in init)
    assert moved > 1e-2, moved


def test_cli_nproc_2_trains_and_one_process_resumes(tmp_path: Path) -> None:
    from sandgym.cli import app

    out = tmp_path / "run"
    args = ["train", str(ROOT / "examples" / "toy.toml"), "--output", str(out), "--no-resume",
            "--set", 'rollout.max_tokens=6', "--set", "rollout.group_size=4"]
    res = CliRunner().invoke(app, [*args, "--steps", "2", "--nproc", "2"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [int(m["step"]) for m in lines] == [1, 2]
    assert all(m["loss_tokens"] > 0 and m["grad_norm"] > 0 for m in lines)
    saved = torch.load(out / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    assert saved["step"] == 2 and saved["data_position"] == 8
    # The checkpoint holds full state dicts: one process carries on from it.
    res = CliRunner().invoke(app, [a for a in args if a != "--no-resume"] + ["--steps", "3"])
    assert res.exit_code == 0, res.output
    steps = [int(json.loads(x)["step"]) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
