"""Policy losses and off-policy corrections, on flat per-token tensors.

Each variant is unit-tested against a float64 loop in tests/train/test_loss.py.

Policy loss (`policy_loss`):
- "ppo": GRPO/DAPO's token-level clipped surrogate, ratio r_t = pi(y_t) / pi_old(y_t) clipped
  to [1 - eps_low, 1 + eps_high] (asymmetric: DAPO's clip-higher);
- "gspo": GSPO's sequence-level ratio s_i = exp(mean_t log r_t) over the sequence's loss
  tokens, clipped to [1 - gspo_eps_low, 1 + gspo_eps_high]; one term per sequence
  (normalization "sequence": GSPO averages over sequences);
- "cispo": CISPO (MiniMax-M1): -sg(min(r_t, 1 + cispo_eps_high)) * A * log pi(y_t): the
  importance weight is truncated and carries no gradient, so no token's gradient is dropped.

Normalisation (`normalization`): "token" (DAPO: sum over all loss tokens of the step / their
count), "sequence" (GRPO: mean over each sequence's tokens, then over sequences), "constant"
(Dr. GRPO: sum / (num sequences x `constant_length`)). Dr. GRPO is normalization "constant"
with `scale_advantages_by_std = false` (advantages are reward - group mean).

Train/inference mismatch correction (`is_correction`): the rollouts were sampled by the
inference engine (another kernel, another precision, and in async runs older weights), so the
behaviour policy is pi_inf, not pi_old. With rho = pi_old / pi_inf, per token (`is_level`
"token"), per sequence (the product over its loss tokens: "sequence") or the sequence's
geometric mean ("geometric"), each policy term is multiplied by a weight without gradient:
- "tis": min(rho, is_high) (truncated importance sampling);
- "mis": rho where is_low <= rho <= is_high, else 0 (masked importance sampling; token-level
  with [0.5, 5] is IcePop);
- "reject": 1 where is_low <= rho <= is_high, else 0 (rejection only, e.g. geometric-mean
  sequence masking).
The mismatch KL(pi_inf || pi_old) (k3 estimator on the sampled tokens) is reported every step
whenever the server returned logprobs, with or without a correction.

Optional KL to a frozen reference (k3 estimator), weight `kl_beta`, is added per token and not
importance-weighted.

Normalisers are computed once per optimizer step (`StepNormalizer`, over every rank's
sequences in a distributed run) so that gradient accumulation over micro-batches gives the
same gradient as one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

# The loss's options live with the rest of the config, which is read without importing torch.
from sandgym.train.config import LossConfig

if TYPE_CHECKING:
    from sandgym.train.batch import Sequence

@dataclass
class StepNormalizer:
    """Denominators for one optimizer step (all micro-batches, all ranks together)."""

    total_tokens: float  # loss tokens in the step
    num_sequences: int
    seq_tokens: torch.Tensor  # (num_sequences,) loss tokens per sequence

    @staticmethod
    def from_masks(masks: list[torch.Tensor], seq_index: list[torch.Tensor], num_sequences: int) -> StepNormalizer:
        counts = torch.zeros(num_sequences, dtype=torch.float64)
        for m, s in zip(masks, seq_index, strict=True):
            counts.index_add_(0, s.cpu(), m.detach().cpu().to(torch.float64))
        return StepNormalizer(total_tokens=float(counts.sum()), num_sequences=num_sequences, seq_tokens=counts)

    @staticmethod
    def from_sequences(seqs: list[Sequence]) -> StepNormalizer:
        """The same counts from the sequences themselves (what pack() turns into masks: a
        token is trained when the token it predicts has loss mask 1)."""
        counts = torch.tensor([float(sum(s.loss_mask[1:])) for s in seqs], dtype=torch.float64)
        return StepNormalizer(total_tokens=float(counts.sum()), num_sequences=len(seqs), seq_tokens=counts)


def _per_seq_sum(x: torch.Tensor, mask: torch.Tensor, seq_index: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add(0, seq_index, x * mask)


def is_weights(
    old_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    mask: torch.Tensor,
    seq_index: torch.Tensor,
    norm: StepNormalizer,
    cfg: LossConfig,
) -> torch.Tensor:
    """Per-token importance weights (no gradient) of `cfg.is_correction` at `cfg.is_level`."""
    d = (old_logprobs.detach() - inference_logprobs).to(old_logprobs.dtype)
    m = mask.to(d.dtype)
    if cfg.is_level == "token":
        rho = torch.exp(d)
    else:
        s = _per_seq_sum(d, m, seq_index, norm.num_sequences)
        if cfg.is_level == "geometric":
            s = s / norm.seq_tokens.to(s.device, s.dtype).clamp(min=1.0)
        rho = torch.exp(s)[seq_index]
    if cfg.is_correction == "tis":
        return torch.clamp(rho, max=cfg.is_high)
    inside = (rho >= cfg.is_low) & (rho <= cfg.is_high)
    if cfg.is_correction == "mis":
        return torch.where(inside, rho, torch.zeros_like(rho))
    if cfg.is_correction == "reject":
        return inside.to(rho.dtype)
    raise ValueError(f"no importance weights for is_correction = {cfg.is_correction!r}")


def per_token_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    cfg: LossConfig,
    inference_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    seq_index: torch.Tensor | None = None,
    norm: StepNormalizer | None = None,
) -> dict[str, torch.Tensor]:
    """Per-token loss and diagnostics (unreduced). Sequence-level options (GSPO, sequence IS
    weights) need `mask`, `seq_index` and `norm`; a sequence lies whole in one micro-batch."""
    seq_level = cfg.policy_loss == "gspo" or (cfg.is_correction != "none" and cfg.is_level != "token")
    if seq_level and (mask is None or seq_index is None or norm is None):
        raise ValueError("sequence-level options need mask, seq_index and norm")
    log_ratio = logprobs - old_logprobs
    out: dict[str, torch.Tensor] = {}
    if cfg.policy_loss == "gspo":
        assert mask is not None and seq_index is not None and norm is not None
        m = mask.to(logprobs.dtype)
        mean_lr = _per_seq_sum(log_ratio, m, seq_index, norm.num_sequences) / norm.seq_tokens.to(
            logprobs.device, logprobs.dtype
        ).clamp(min=1.0)
        ratio = torch.exp(mean_lr)[seq_index]
        pg1 = -advantages * ratio
        pg2 = -advantages * torch.clamp(ratio, 1.0 - cfg.gspo_eps_low, 1.0 + cfg.gspo_eps_high)
        pg = torch.maximum(pg1, pg2)
        out["clipped"] = (pg2 > pg1).to(logprobs.dtype)
    elif cfg.policy_loss == "cispo":
        ratio = torch.exp(log_ratio)
        cap = 1.0 + cfg.cispo_eps_high
        w = torch.clamp(ratio, max=cap).detach()
        pg = -advantages * w * logprobs
        out["clipped"] = (ratio.detach() > cap).to(logprobs.dtype)
    else:
        ratio = torch.exp(log_ratio)
        pg1 = -advantages * ratio
        pg2 = -advantages * torch.clamp(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
        pg = torch.maximum(pg1, pg2)
        out["clipped"] = (pg2 > pg1).to(logprobs.dtype)
    out["ratio"] = ratio.detach()
    if cfg.is_correction != "none":
        if inference_logprobs is None:
            raise ValueError(f"is_correction = {cfg.is_correction!r} needs the inference server's logprobs")
        w_is = is_weights(
            old_logprobs,
            inference_logprobs,
            mask if mask is not None else torch.ones_like(logprobs),
            seq_index if seq_index is not None else torch.zeros_like(logprobs, dtype=torch.long),
            norm if norm is not None else StepNormalizer(0.0, 1, torch.zeros(1, dtype=torch.float64)),
            cfg,
        )
        pg = pg * w_is
        out["is_weight"] = w_is
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
    (and ranks) of a step gives the step loss."""
    m = mask.to(per_token.dtype)
    if cfg.normalization == "token":
        return (per_token * m).sum() / max(norm.total_tokens, 1.0)
    if cfg.normalization == "sequence":
        denom = norm.seq_tokens.to(per_token.device, per_token.dtype)[seq_index].clamp(min=1.0)
        return (per_token * m / denom).sum() / max(norm.num_sequences, 1)
    if cfg.normalization == "constant":
        return (per_token * m).sum() / (max(norm.num_sequences, 1) * cfg.constant_length)
    raise ValueError(f"unknown normalization {cfg.normalization!r}")


def mismatch_kl(old_logprobs: torch.Tensor, inference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_inf || pi_old) on tokens sampled by pi_inf: with
    d = log pi_old - log pi_inf, exp(d) - 1 - d (unbiased, non-negative)."""
    d = old_logprobs.detach() - inference_logprobs
    return torch.exp(d) - 1.0 - d


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
    terms = per_token_terms(
        logprobs, old_logprobs, advantages, cfg, inference_logprobs, ref_logprobs, mask=mask, seq_index=seq_index, norm=norm
    )
    loss = reduce_loss(terms["loss"], mask, seq_index, norm, cfg)
    m = mask.to(logprobs.dtype)
    stats = {
        "clip_sum": (terms["clipped"] * m).sum().detach(),
        "ratio_sum": (terms["ratio"] * m).sum(),
        "tokens": m.sum(),
    }
    if "kl" in terms:
        stats["kl_sum"] = (terms["kl"] * m).sum()
    if "is_weight" in terms:
        w = terms["is_weight"]
        stats["is_weight_sum"] = (w * m).sum().detach()
        stats["is_masked_sum"] = ((w == 0).to(m.dtype) * m).sum().detach()
    if inference_logprobs is not None:
        stats["mismatch_kl_sum"] = (mismatch_kl(old_logprobs, inference_logprobs) * m).sum().detach()
    return loss, stats
