"""Fused LM head + token logprob (+ entropy) kernels from maintained packages.

Each function here has the signature of `logprobs.chunked_logprobs` (sandgym's own PyTorch
path): hidden (N, H), the LM head module, targets (N,) -> (logprobs (N,) with grad, entropy
(N,) without grad, or None where the kernel does not compute it). `logprobs.HEAD_KERNELS`
names them; `ModelConfig.logprob_kernel` picks one.

- "trl": TRL's `ChunkedLogProbFunction` (trl.kernels): cuBLAS tiles of (4,096 tokens x
  `TRL_VOCAB_CHUNK` vocabulary) folded by a Triton kernel into online-logsumexp statistics in
  one pass, entropy included; backward turns each recomputed tile into d(logits) in place and
  accumulates the gradient products in float32. Without Triton (CPU) the same tiles run as
  torch ops, so the path can be checked anywhere.
- "liger": liger-kernel's fused linear cross-entropy with per-token losses (logprob = -loss);
  its backward recomputes the chunked logits and folds the per-token gradient in. CUDA only
  (Triton), and it computes no entropy.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

# TRL's own default for its fused LM head (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE).
TRL_VOCAB_CHUNK = 32768


@functools.cache
def _trl_function() -> Any:
    try:
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction
    except Exception:  # not installed, or built for another torch/transformers
        return None
    return ChunkedLogProbFunction


@functools.cache
def _liger_function() -> Any:
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    except Exception:  # not installed, or no Triton
        return None
    return LigerFusedLinearCrossEntropyFunction


def available(name: str, device: torch.device) -> bool:
    """Whether the fused kernel `name` can run on `device` here."""
    if name == "trl":
        return _trl_function() is not None
    if name == "liger":
        return device.type == "cuda" and _liger_function() is not None
    raise ValueError(f"unknown fused logprob kernel {name!r}")


def _empty(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # An all-masked micro-batch: zeros still connected to the graph, so backward runs.
    z = hidden.new_zeros(0, dtype=torch.float32)
    return z + hidden.sum() * 0, z


def _head_weight(lm_head: torch.nn.Module) -> torch.Tensor:
    if getattr(lm_head, "bias", None) is not None:
        raise NotImplementedError("LM heads with a bias are not supported")
    weight = lm_head.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def trl_logprobs(
    hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, chunk_size: int = 1024, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs and entropy through TRL's fused LM head. `chunk_size` is unused: TRL tiles
    4,096 tokens at a time itself."""
    weight = _head_weight(lm_head)
    if hidden.shape[0] == 0:
        return _empty(hidden)
    fn = _trl_function()
    # bias, temperature, vocabulary chunk, softcapping, logit scale, optional outputs
    lp, ent, *_ = fn.apply(hidden, weight, None, targets, temperature, TRL_VOCAB_CHUNK, None, 1.0, ("entropy",))
    return lp, ent.detach()


def liger_logprobs(
    hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, chunk_size: int = 1024, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs through liger-kernel's fused linear cross-entropy (no entropy: None)."""
    weight = _head_weight(lm_head)
    if hidden.shape[0] == 0:
        return _empty(hidden)
    if temperature != 1.0:
        hidden = hidden * (1.0 / temperature)  # (h / T) W^T = logits / T
    if hidden.dtype == torch.float32 and torch.is_autocast_enabled(hidden.device.type):
        hidden = hidden.to(torch.get_autocast_dtype(hidden.device.type))
    # Liger sizes its token chunks as N / ceil(V / (c * H)); choose c so that a chunk holds
    # about `chunk_size` tokens, as sandgym's own path does.
    n, h = hidden.shape
    per = max(1, math.ceil(n / chunk_size))
    mem_const = max(1, math.ceil(weight.shape[0] / (h * per)))
    fn = _liger_function()
    # (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing,
    #  reduction, softcap, return_z_loss, accum_dtype, use_token_scaling,
    #  return_token_accuracy, return_predicted_tokens, ce_impl, ce_mode, chunk_mem_const)
    loss = fn.apply(hidden, weight, targets, None, None, -100, 0.0, 0.0, "none", None, False, torch.float32, False, False, False, None, None, mem_const)[0]
    return -loss, None
