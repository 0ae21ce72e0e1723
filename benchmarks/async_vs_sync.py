"""Synchronous vs asynchronous GRPO on CPU (issue 13): wall time per step and reward curves.

Runs the same training config (same seeds, same data) with `optim.async_level` 0 (generate,
then train), 1 and 2 (generation of the next steps goes on while the trainer trains; weights
are pushed under the rollouts in flight), and prints, per level: mean wall time per step
(after the first step, which includes start-up), the time the trainer waited for rollouts,
the training time, staleness, dropped stale groups, and the ratio of step time to the
synchronous baseline measured in the same run; then the reward curves side by side (mean
over seeds) and their last-steps mean.

    python3 benchmarks/async_vs_sync.py CONFIG.toml [--steps N] [--seeds 0 1 2] [--levels 0 1 2]
        [--set section.key=JSON ...] [--json out.json]

CONFIG is any `sandgym train` config, e.g. a sandboxed multi-turn environment warm-started
from an SFT checkpoint (examples/pycalc_grpo.toml); with no CONFIG, examples/toy.toml.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_one(config: Path, overrides: dict[str, Any], out: Path) -> tuple[list[dict[str, float]], float]:
    from sandgym.train.config import TrainConfig
    from sandgym.train.trainer import Trainer

    cfg = TrainConfig.from_toml(config, {**overrides, "output.dir": str(out), "output.resume": False, "output.plot": False, "output.checkpoint_every": 0})
    t0 = time.perf_counter()
    hist = Trainer(cfg).run()
    return hist, time.perf_counter() - t0


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default=str(ROOT / "examples" / "toy.toml"))
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", dest="sets", action="append", default=[], help="section.key=JSON override")
    ap.add_argument("--json", default=None, help="write every run's metrics here")
    args = ap.parse_args()

    base: dict[str, Any] = {}
    for item in args.sets:
        k, _, v = item.partition("=")
        try:
            base[k] = json.loads(v)
        except json.JSONDecodeError:
            base[k] = v
    if args.steps is not None:
        base["optim.steps"] = args.steps
    config = Path(args.config)
    runs: dict[int, list[tuple[list[dict[str, float]], float]]] = {lv: [] for lv in args.levels}
    with tempfile.TemporaryDirectory(prefix="sandgym-async-bench-") as tmp:
        # One untimed run first: imports, the server stack, sandbox images warm up once.
        run_one(config, {**base, "optim.steps": 2}, Path(tmp) / "warmup")
        # Seeds outer, levels inner: a slow spell of the machine hits every level alike.
        for seed in args.seeds:
            for lv in args.levels:
                over = {**base, "optim.seed": seed, "optim.async_level": lv, "optim.max_off_policy_steps": max(lv, 2)}
                hist, wall = run_one(config, over, Path(tmp) / f"s{seed}-a{lv}")
                runs[lv].append((hist, wall))
                print(
                    f"seed {seed} async_level {lv}: {len(hist)} steps in {wall:.1f}s; "
                    f"reward {hist[0]['reward_mean']:.3f} -> {hist[-1]['reward_mean']:.3f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): [h for h, _ in v] for k, v in runs.items()}, indent=1))

    def per_step(lv: int, key: str) -> list[float]:
        return [m[key] for hist, _ in runs[lv] for m in hist[1:]]  # step 1 includes start-up

    rows = []
    base_step = mean(per_step(args.levels[0], "step_s"))
    for lv in args.levels:
        step_s = mean(per_step(lv, "step_s"))
        rows.append(
            (
                lv,
                step_s,
                mean(per_step(lv, "generate_s")),
                mean(per_step(lv, "train_s")),
                mean([m["staleness"] for hist, _ in runs[lv] for m in hist]),
                sum(m["stale_groups_dropped"] for hist, _ in runs[lv] for m in hist),
                mean([w for _, w in runs[lv]]),
                step_s / base_step,
            )
        )
    n_steps = min(len(h) for lv in args.levels for h, _ in runs[lv])
    curves = {lv: [mean([hist[i]["reward_mean"] for hist, _ in runs[lv]]) for i in range(n_steps)] for lv in args.levels}
    tail = max(1, n_steps // 4)

    print()
    print(f"config {config.name}; seeds {args.seeds}; {n_steps} steps; {os.cpu_count()} CPUs; overrides {base}")
    print("| async_level | step wall s (mean, steps 2..) | waiting for rollouts s | training s | staleness | stale groups dropped | run wall s | step time vs sync |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for lv, step_s, gen, train, stale, dropped, wall, ratio in rows:
        print(f"| {lv} | {step_s:.2f} | {gen:.2f} | {train:.2f} | {stale:.2f} | {int(dropped)} | {wall:.1f} | {ratio:.2f} |")
    print()
    print("| step | " + " | ".join(f"reward, async_level {lv}" for lv in args.levels) + " |")
    print("| --- | " + " | ".join("---" for _ in args.levels) + " |")
    for i in range(n_steps):
        print(f"| {i + 1} | " + " | ".join(f"{curves[lv][i]:.3f}" for lv in args.levels) + " |")
    print(f"| last {tail} mean | " + " | ".join(f"{mean(curves[lv][-tail:]):.3f}" for lv in args.levels) + " |")


if __name__ == "__main__":
    main()
