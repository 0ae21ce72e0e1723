"""GRPO loss and its variants, on flat per-token tensors.

Variants (each unit-tested against a float64 loop in tests/train/test_loss.py):
- advantages (sandgym.core.stats.group_advantages, shared with environments' rubrics):
  group-normalised, divided by the group std (GRPO) or not (Dr. GRPO);
- normalisation: "token" (DAPO: sum over all loss tokens of the step / their count),
  "sequence" (GRPO: mean over each sequence's tokens, then mean over sequences),
  "constant" (Dr. GRPO: sum / (num sequences x a fixed max length));
- asymmetric clipping of the ratio to [1 - eps_low, 1 + eps_high];
- optional KL to a frozen reference (k3 estimator), weight `kl_beta`;
- truncated importance sampling (TIS) between the trainer's old logprobs and the inference
  server's logprobs: per-token weight min(exp(old - inference), tis_cap), no gradient.

Normalisers are computed once per optimizer step (`StepNormalizer`) so that gradient
accumulation over micro-batches gives the same gradient as one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, Field

Normalization = Literal["token", "sequence", "constant"]


class LossConfig(BaseModel):
    eps_low: float = Field(0.2, ge=0.0)
    eps_high: float = Field(0.28, ge=0.0)  # DAPO's clip-higher default
    normalization: Normalization = "token"
    constant_length: int = Field(1024, gt=0)  # Dr. GRPO's fixed denominator per sequence
    kl_beta: float = Field(0.0, ge=0.0)
    tis: bool = False
    tis_cap: float = Field(2.0, gt=0.0)
    scale_advantages_by_std: bool = True
    advantage_eps: float = Field(1e-6, gt=0.0)


@dataclass
class StepNormalizer:
    """Denominators for one optimizer step (all micro-batches together)."""

    total_tokens: float  # loss tokens in the step
    num_sequences: int
    seq_tokens: torch.Tensor  # (num_sequences,) loss tokens per sequence

    @staticmethod
    def from_masks(masks: list[torch.Tensor], seq_index: list[torch.Tensor], num_sequences: int) -> "StepNormalizer":
        counts = torch.zeros(num_sequences, dtype=torch.float64)
        for m, s in zip(masks, seq_index):
            counts.index_add_(0, s.cpu(), m.detach().cpu().to(torch.float64))
        return StepNormalizer(total_tokens=float(counts.sum()), num_sequences=num_sequences, seq_tokens=counts)


def per_token_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    cfg: LossConfig,
    inference_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-token loss and diagnostics (unreduced)."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    pg = torch.maximum(pg1, pg2)
    clipped = (pg2 > pg1).to(logprobs.dtype)
    out: dict[str, torch.Tensor] = {"ratio": ratio.detach(), "clipped": clipped}
    if cfg.tis:
        if inference_logprobs is None:
            raise ValueError("tis=True needs the inference server's logprobs")
        w = torch.clamp(torch.exp(old_logprobs.detach() - inference_logprobs), max=cfg.tis_cap)
        pg = pg * w
        out["tis_weight"] = w
    loss = pg
    if cfg.kl_beta > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_beta > 0 needs reference logprobs")
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1.0  # k3: unbiased, non-negative
        loss = loss + cfg.kl_beta * kl
        out["kl"] = kl.detach()
    out["loss"] = loss
    return out


def reduce_loss(
    per_token: torch.Tensor, mask: torch.Tensor, seq_index: torch.Tensor, norm: StepNormalizer, cfg: LossConfig
) -> torch.Tensor:
    """This micro-batch's share of the step loss; summing the shares over all micro-batches
    of a step gives the step loss."""
    m = mask.to(per_token.dtype)
    if cfg.normalization == "token":
        return (per_token * m).sum() / max(norm.total_tokens, 1.0)
    if cfg.normalization == "sequence":
        denom = norm.seq_tokens.to(per_token.device, per_token.dtype)[seq_index].clamp(min=1.0)
        return (per_token * m / denom).sum() / max(norm.num_sequences, 1)
    if cfg.normalization == "constant":
        return (per_token * m).sum() / (max(norm.num_sequences, 1) * cfg.constant_length)
    raise ValueError(f"unknown normalization {cfg.normalization!r}")


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    seq_index: torch.Tensor,
    norm: StepNormalizer,
    cfg: LossConfig,
    inference_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss share of one micro-batch and metric sums (0-d tensors, detached, so the caller
    decides when to synchronise; divide by total_tokens for means)."""
    terms = per_token_terms(logprobs, old_logprobs, advantages, cfg, inference_logprobs, ref_logprobs)
    loss = reduce_loss(terms["loss"], mask, seq_index, norm, cfg)
    m = mask.to(logprobs.dtype)
    stats = {
        "clip_sum": (terms["clipped"] * m).sum().detach(),
        "ratio_sum": (terms["ratio"] * m).sum(),
        "tokens": m.sum(),
    }
    if "kl" in terms:
        stats["kl_sum"] = (terms["kl"] * m).sum()
    if "tis_weight" in terms:
        stats["tis_weight_sum"] = (terms["tis_weight"] * m).sum().detach()
    return loss, stats
