"""Supervised fine-tuning on rollout records (`sandgym sft CONFIG.toml`): a warm start for GRPO.

Data: JSONL files in the format `sandgym eval` writes (one State per line: prompt, tool
schemas, turns with messages and, from a model server, token ids). Records that failed
(`error`) or scored below `data.min_reward` are left out. Each record becomes one sequence
(trajectory.record_to_sequence): token ids when the record has them, else its text rendered
with the model's chat template in the token-in layout that RL rollouts have. Only the
assistant's completion tokens are trained: prompts, tool results and template glue have loss
mask 0 and get no gradient.

Loss: the mean negative log-likelihood over the step's completion tokens (token-mean across
the batch, so gradient accumulation over packed micro-batches equals one big batch).

Output folder: config.json (the resolved config), metrics.jsonl (one line per step), and a
checkpoint (train/checkpoints.py: model, optimizer, step, config): what `[model] init_from`
of `sandgym train` reads.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sandgym.train.batch import MicroBatch, Sequence, pack
from sandgym.train.checkpoints import write_checkpoint
from sandgym.train.folder import CONFIG, METRICS
from sandgym.train.logprobs import pick_head_kernel
from sandgym.train.policy import LogprobModel, autocast, autocast_dtype, lr_lambda, resolve_device
from sandgym.train.sft_data import SFTConfig, read_records

log = logging.getLogger(__name__)


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, total_tokens: float) -> torch.Tensor:
    """Negative log-likelihood summed over mask-1 tokens, divided by the step's mask-1 token
    count (so micro-batches add up to the step's token mean)."""
    return -(logprobs * mask).sum() / max(total_tokens, 1.0)


class SFTTrainer:
    def __init__(
        self,
        cfg: SFTConfig,
        on_step: Callable[[dict[str, float]], None] | None = None,
        records: list[dict[str, Any]] | None = None,
    ) -> None:
        """`records`: what `read_records(cfg.data)` gave, when the caller has read them already."""
        from sandgym.train.attention import pick_kernel, takes_shared_prefix, use_varlen
        from sandgym.train.config import TrainConfig
        from sandgym.train.trainer import load_model_and_tokenizer
        from sandgym.train.trajectory import record_to_sequence

        self.cfg = cfg
        self.on_step = on_step
        self.out = Path(cfg.output.dir)
        torch.manual_seed(cfg.optim.seed)
        self.device = resolve_device(cfg.model.device)
        if records is None:
            records = read_records(cfg.data)  # before any model is built: bad data stops here
        tcfg = TrainConfig.model_validate({"model": cfg.model.model_dump(), "optim": {"seed": cfg.optim.seed}})
        model, self.tokenizer = load_model_and_tokenizer(tcfg)
        if cfg.model.init_from:
            from sandgym.train.checkpoints import load_weights

            load_weights(model, cfg.model.init_from, cfg.model.model_dump(mode="json"))
        self.model = model.to(self.device)  # type: ignore[arg-type]  # transformers wraps PreTrainedModel.to with functools.wraps, which hides the bound self from mypy
        self.kernel = pick_kernel(self.device, cfg.model.attention)
        self.share_prefix = cfg.model.share_prefix and takes_shared_prefix(self.kernel)
        self.head_kernel = pick_head_kernel(self.device, cfg.model.logprob_kernel)
        use_varlen(self.model)
        self.amp = autocast_dtype(cfg.model, self.device)
        self.lp_model = LogprobModel(self.model, self.kernel, cfg.model.logprob_chunk_size, self.head_kernel)
        self.sequences: list[Sequence] = [record_to_sequence(r, self.tokenizer) for r in records]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o.warmup_steps, o.steps, o.schedule))
        self.rng = random.Random(o.seed)
        self.order: list[int] = []
        self.step = 0

    def next_batch(self) -> list[Sequence]:
        """`batch_size` sequences, shuffled epochs over the data (deterministic per seed)."""
        out: list[Sequence] = []
        while len(out) < self.cfg.optim.batch_size:
            if not self.order:
                self.order = list(range(len(self.sequences)))
                self.rng.shuffle(self.order)
            out.append(self.sequences[self.order.pop()])
        return out

    def _logprobs(self, mb: MicroBatch) -> torch.Tensor:
        with autocast(self.device, self.amp):
            lp, _ = self.lp_model(mb)
        return lp

    def train_step(self, seqs: list[Sequence]) -> dict[str, float]:
        t0 = time.perf_counter()
        self.model.train()
        mbs = [mb.to(self.device) for mb in pack(seqs, self.cfg.optim.micro_batch_tokens, share_prefix=self.share_prefix)]
        total = float(sum(float(mb.mask.sum()) for mb in mbs))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for mb in mbs:
            loss = sft_loss(self._logprobs(mb), mb.mask, total)
            loss.backward()
            loss_sum += float(loss.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return {
            "step": float(self.step),
            "loss": loss_sum,
            "loss_tokens": total,
            "train_tokens": float(sum(mb.num_tokens for mb in mbs)),
            "grad_norm": float(grad_norm),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "train_s": time.perf_counter() - t0,
        }

    def save_checkpoint(self) -> Path:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "config": self.cfg.model_dump(mode="json"),
        }
        return write_checkpoint(self.out, self.step, state, self.cfg.output.keep_checkpoints)

    def run(self) -> list[dict[str, float]]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / CONFIG).write_text(json.dumps(self.cfg.model_dump(mode="json"), indent=2) + "\n")
        metrics = self.out / METRICS
        metrics.write_text("")  # a fresh run (SFT runs are short; no resume)
        history = []
        with metrics.open("a") as f:
            while self.step < self.cfg.optim.steps:
                m = self.train_step(self.next_batch())
                f.write(json.dumps(m) + "\n")
                history.append(m)
                if self.on_step is not None:
                    self.on_step(m)
        self.checkpoint = self.save_checkpoint()
        return history
