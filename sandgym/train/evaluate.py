"""Evaluate a run's policy (an SFT or GRPO checkpoint) on an environment's held-out rows:
the checkpoint's model behind the built-in transformers backend, rolled out by
`sandgym.core.evaluation.run_eval` (the same path as `sandgym eval`, records and summary
included). One function for every checkpoint, so runs are compared on equal terms.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio


@contextmanager
def serve_checkpoint(checkpoint: str | Path, max_batch_size: int = 64) -> Iterator[Any]:
    """A run's policy (the newest checkpoint under `checkpoint`, or that checkpoint) behind
    the built-in transformers backend's OpenAI-compatible server on 127.0.0.1, for the block."""
    from sandgym.train.backends.hf import HFBackend
    from sandgym.train.checkpoints import load_weights, model_section, read_checkpoint
    from sandgym.train.config import TrainConfig
    from sandgym.train.trainer import load_model_and_tokenizer

    state = read_checkpoint(checkpoint)
    cfg = TrainConfig.model_validate({"model": {**model_section(state), "init_from": None}})
    model, tokenizer = load_model_and_tokenizer(cfg)
    load_weights(model, state["path"])
    model.eval()
    with HFBackend(model, tokenizer, model_name=Path(state["path"]).parent.parent.name or "sandgym-policy", max_batch_size=max_batch_size) as backend:
        backend.checkpoint = state["path"]
        yield backend


def evaluate_checkpoint(
    checkpoint: str | Path,
    env_name: str,
    env_args: dict[str, Any] | None = None,
    *,
    output_dir: str | Path,
    provider: str = "docker",
    num_examples: int | None = None,
    rollouts_per_example: int = 1,
    temperature: float = 1.0,
    max_tokens: int = 256,
    concurrency: int = 16,
    max_sandboxes: int | None = None,
    seed: int = 0,
    token_in: bool = True,
) -> dict[str, Any]:
    """Roll out the checkpoint's policy (sampling at `temperature`, torch seeded with `seed`)
    on the environment's eval rows; returns run_eval's summary (`reward_mean`, `passed`, ...)."""
    import torch

    from sandgym import envs
    from sandgym.core.clients import OpenAIClient
    from sandgym.core.evaluation import run_eval

    env = envs.load_environment(env_name, **dict(env_args or {}))
    sampling = {"temperature": temperature, "max_tokens": max_tokens}
    with serve_checkpoint(checkpoint, max_batch_size=max(concurrency, 1)) as backend:
        torch.manual_seed(seed)

        async def main() -> dict[str, Any]:
            client = OpenAIClient(backend.base_url, "sandgym", token_in=token_in)
            try:
                return await run_eval(
                    env,
                    client,
                    backend.model_name,
                    output_dir=output_dir,
                    num_examples=num_examples,
                    rollouts_per_example=rollouts_per_example,
                    concurrency=concurrency,
                    sampling_args=sampling,
                    provider=provider,
                    max_sandboxes=max_sandboxes,
                    meta={"checkpoint": backend.checkpoint, "provider": provider, "env_args": env_args or {}, "seed": seed},
                )
            finally:
                await client.aclose()
                await env.close()

        return anyio.run(main)
