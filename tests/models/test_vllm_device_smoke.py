"""benchmarks/vllm_device.py's non-vLLM sections on CPU (--cpu-smoke): builds the offline
model, takes a PolicyTrainer step, generates with the transformers backend and compares packed
vs padded attention. Keeps the device script from rotting between device sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "vllm_device.py"), "--cpu-smoke",
        "--out", str(out), "--model-dir", str(tmp_path / "model"), "--size", "tiny", "--vocab", "400",
        "--prompts", "2", "--group", "2", "--prompt-len", "12", "--max-tokens", "16",
        "--check-seqs", "2", "--attn-seqs", "4", "--reps", "1", "--micro-batch-tokens", "64",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "vllm_device.json").read_text())
    assert r["errors"] == {}, r["errors"]
    assert r["model"]["tokenizer_vocab"] == 400
    assert r["train_step"]["backend"] == "sandgym.train.policy.PolicyTrainer"
    assert r["hf_gen"]["tokens"] == 2 * 2 * 16
    att = r["attention"]
    assert att["real_tokens"] < att["padded_tokens"]
    packed = att["packed_sdpa"]
    # Same loss on the same batch, packed vs padded (float32 on CPU: rounding only).
    assert packed["loss_rel_diff_vs_padded"] < 1e-3
    assert "device" in (out / "vllm_device.log").read_text()
