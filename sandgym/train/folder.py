"""A training run's folder, as `sandgym train` (GRPO) and `sandgym sft` write it and
`sandgym view` reads it:

    DIR/config.json        the resolved config (an SFT config has a `data` section)
    DIR/metrics.jsonl      one line per optimizer step, with "step"
    DIR/samples.jsonl      GRPO only: `output.samples_per_step` rollout records of each step,
                           with "step"; a step's samples are written before its metrics line
    DIR/reward_loss.png    GRPO only: reward and loss per step
    DIR/checkpoints/       step_NNNNNN/ folders (sandgym.train.checkpoints)

Names only (no torch): the viewer imports this without the training stack.
"""

from __future__ import annotations

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
PLOT = "reward_loss.png"
CHECKPOINTS = "checkpoints"
