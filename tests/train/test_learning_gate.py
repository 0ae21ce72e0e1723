"""The learning gate: GRPO through real sandboxes makes a model better, on CPU, per seed.

pycalc (sandgym/envs/pycalc.py): the numbers of each task exist only in the rollout's own
sandbox, so success needs a python tool call run there whose printed result the judge -- run
in the same sandbox on the task's data -- accepts, then a closing final answer. For each seed:

1. `sandgym sft` (examples/pycalc_sft.toml) on the unfiltered records that `sandgym eval`
   made of a demonstrator on the training tasks: it knows the protocol but runs the question's
   program only 40% of the time (`oracle_accuracy = 0.4`), and SFT imitates it;
2. evaluation of the SFT policy on the 64 held-out tasks (sampling at temperature 1);
3. `sandgym train` (examples/pycalc_grpo.toml): GRPO from the SFT checkpoint, token-in
   multi-turn rollouts, sandbox-judged reward;
4. the same evaluation of the GRPO policy.

Gate: success after GRPO exceeds success after SFT by at least 0.3, or reaches 0.9. The
per-seed numbers are printed (and written to the run folder's gate.json).

Budget: the work is bounded by steps (256 demonstrations, 300 SFT steps, 16 GRPO steps,
2 x 128 evaluation samples), not by the clock: a loaded machine makes it slower, never
failed. The only time limit is a safety bound against a hung run (SAFETY_BOUND_S, far
above the ~3 minutes a seed takes on a quiet 2-core machine). CI runs seed 0;
SANDGYM_GATE_SEEDS=0,1,2 runs the three seeds of benchmarks/RESULTS.md.
SANDGYM_GATE_GRPO='{"optim.lr": 0}' (any GRPO config overrides, JSON) shows the gate
failing when GRPO learns nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandgym.train.config import TrainConfig
from sandgym.train.evaluate import evaluate_checkpoint
from sandgym.train.sft import SFTConfig, SFTTrainer
from sandgym.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
SEEDS = tuple(int(s) for s in os.environ.get("SANDGYM_GATE_SEEDS", "0").split(","))
GRPO_OVERRIDES: dict[str, Any] = json.loads(os.environ.get("SANDGYM_GATE_GRPO") or "{}")
SAFETY_BOUND_S = 3600  # a hung run; the work itself is bounded by steps
# docker (the default; a sandbox is reset and reused between rollouts) or local.
PROVIDER = os.environ.get("SANDGYM_GATE_PROVIDER", "docker")
EVAL = {"num_examples": 64, "rollouts_per_example": 2, "temperature": 1.0, "max_tokens": 96, "concurrency": 32}

DEMONSTRATOR_ACCURACY = 0.4
pytestmark = [pytest.mark.docker] if PROVIDER == "docker" else []


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demonstrator's records on the training tasks, as `sandgym eval pycalc --policy
    oracle -a split=train -a oracle_accuracy=0.4 -n 256` makes them."""
    from sandgym import envs
    from sandgym.core.evaluation import run_eval
    from sandgym.core.policies import get_policy

    out = tmp_path_factory.mktemp("pycalc_demos")
    env = envs.load_environment("pycalc", split="train", oracle_accuracy=DEMONSTRATOR_ACCURACY)

    async def main() -> dict[str, Any]:
        return await run_eval(env, get_policy("oracle", env), "oracle", output_dir=out, num_examples=256, concurrency=16, provider=PROVIDER)

    summary = anyio.run(main)
    # Solved when it picked the right program (or a wrong one that printed the same digit).
    assert summary["errors"] == 0 and DEMONSTRATOR_ACCURACY <= summary["reward_mean"] < 0.6, summary
    return out / "results.jsonl"


def _run_seed(seed: int, demos: Path, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    sft = SFTConfig.from_toml(
        ROOT / "examples" / "pycalc_sft.toml",
        {"data.paths": [str(demos)], "optim.seed": seed, "output.dir": str(out / "sft")},
    )
    SFTTrainer(sft).run()
    t_sft = time.perf_counter()
    ev = {**EVAL, "provider": PROVIDER, "seed": seed}
    before = evaluate_checkpoint(out / "sft", "pycalc", output_dir=out / "eval_sft", **ev)
    t_eval = time.perf_counter()
    grpo = TrainConfig.from_toml(
        ROOT / "examples" / "pycalc_grpo.toml",
        {
            "model.init_from": str(out / "sft"),
            "env.provider": PROVIDER,
            "optim.seed": seed,
            "output.dir": str(out / "grpo"),
            "output.resume": False,
            **GRPO_OVERRIDES,
        },
    )
    hist = Trainer(grpo).run()
    t_grpo = time.perf_counter()
    after = evaluate_checkpoint(out / "grpo", "pycalc", output_dir=out / "eval_grpo", **ev)
    t_end = time.perf_counter()
    return {
        "seed": seed,
        "provider": PROVIDER,
        "sft_success": before["reward_mean"],
        "grpo_success": after["reward_mean"],
        "sft_tool_ran": before["metrics"].get("tool_ran"),
        "grpo_tool_ran": after["metrics"].get("tool_ran"),
        "infra_failures": before["errors"] + after["errors"] + sum(int(m["rollout_errors"]) for m in hist),
        "prefix_mismatch_skipped": sum(int(m["prefix_mismatch_skipped"]) for m in hist),
        "train_reward": [round(m["reward_mean"], 3) for m in hist],
        "sft_s": t_sft - t0,
        "eval_s": (t_eval - t_sft) + (t_end - t_grpo),
        "grpo_s": t_grpo - t_eval,
        "wall_s": t_end - t0,
    }


@pytest.mark.slow
@pytest.mark.timeout(SAFETY_BOUND_S)
@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_through_sandboxes_beats_sft(seed: int, demos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run_seed(seed, demos, tmp_path)
    (tmp_path / "gate.json").write_text(json.dumps(r, indent=1))
    with capsys.disabled():
        print(
            f"\n[pycalc gate] seed {seed}: success SFT {r['sft_success']:.3f} -> GRPO {r['grpo_success']:.3f} "
            f"(+{r['grpo_success'] - r['sft_success']:.3f}); train reward {r['train_reward']}; "
            f"wall {r['wall_s']:.0f}s (sft {r['sft_s']:.0f}s, grpo {r['grpo_s']:.0f}s, evals {r['eval_s']:.0f}s; {PROVIDER})"
        )
    assert r["infra_failures"] == 0 and r["prefix_mismatch_skipped"] == 0, r
    assert r["grpo_success"] >= r["sft_success"] + 0.3 or r["grpo_success"] >= 0.9, r
