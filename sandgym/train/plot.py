"""Metrics JSONL -> PNG plot of reward and loss by step (matplotlib, headless Agg)."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def plot_metrics(metrics_path: str | Path, out_path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].plot(steps, [r["reward_mean"] for r in rows], marker="o", ms=3)
    axes[0].set_title("reward (mean over rollouts)")
    axes[0].set_xlabel("step")
    axes[1].plot(steps, [r["loss"] for r in rows], marker="o", ms=3, color="tab:red")
    axes[1].set_title("loss")
    axes[1].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
