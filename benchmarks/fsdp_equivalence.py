"""FSDP2 equivalence on CPU (issue 13): N processes (torchrun, gloo) vs 1 process on the same
global batch; prints the losses, gradient norms and the largest weight difference after the
steps, per loss variant, and the wall time of each run as a ratio to the 1-process run.

    python3 benchmarks/fsdp_equivalence.py [--nproc 2]

The worker (tests/train/fsdp_step_worker.py, also used by tests/train/test_fsdp.py) takes 2
PolicyTrainer steps (2 optimizer passes each, 64-token micro-batches) on 12 fixed sequences
with a tiny random Qwen2-shaped model.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "train" / "fsdp_step_worker.py"
LOSSES = [
    {"normalization": "token"},
    {"kl_beta": 0.1, "is_correction": "tis", "normalization": "token"},
    {"normalization": "sequence", "is_correction": "mis", "is_low": 0.5, "is_high": 2.0},
    {"policy_loss": "gspo", "normalization": "sequence", "gspo_eps_low": 0.3, "gspo_eps_high": 0.4},
    {"policy_loss": "cispo", "normalization": "token", "cispo_eps_high": 0.5},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(res.stdout[-3000:] + res.stderr[-3000:])
    return time.perf_counter() - t0


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    losses = json.dumps(LOSSES)
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp) / "one.pt", Path(tmp) / "many.pt"
        t1 = run([sys.executable, str(WORKER), str(one), losses])
        tn = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), "--master-addr", "127.0.0.1",
                  "--master-port", str(free_port()), str(WORKER), str(many), losses])
        a, b = torch.load(one, weights_only=False), torch.load(many, weights_only=False)
    n = args.nproc
    print(f"\n1 process vs {n} processes (torchrun, gloo, CPU), same global batch; wall {t1:.1f}s vs {tn:.1f}s (ratio {tn / t1:.2f}, start-up included)")
    print(f"| loss | step | loss (1 proc) | loss ({n} procs) | rel. diff | grad norm (1) | grad norm ({n}) | max abs weight diff after 2 steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for ra, rb in zip(a["results"], b["results"]):
        name = ", ".join(f"{k}={v}" for k, v in ra["loss"].items())
        diff = max(float((ra["state"][k] - rb["state"][k]).abs().max()) for k in ra["state"])
        for i, (ma, mb) in enumerate(zip(ra["metrics"], rb["metrics"])):
            rel = abs(ma["loss"] - mb["loss"]) / max(abs(ma["loss"]), 1e-12)
            print(f"| {name} | {i + 1} | {ma['loss']:.8f} | {mb['loss']:.8f} | {rel:.1e} | {ma['grad_norm']:.6f} | {mb['grad_norm']:.6f} | "
                  f"{diff:.1e} |" if i == len(ra["metrics"]) - 1 else
                  f"| {name} | {i + 1} | {ma['loss']:.8f} | {mb['loss']:.8f} | {rel:.1e} | {ma['grad_norm']:.6f} | {mb['grad_norm']:.6f} | |")


if __name__ == "__main__":
    main()
