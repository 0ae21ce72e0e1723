"""Token logprobs (and entropy) from hidden states, in chunks.

Full logits for a packed batch would be T x V floats (e.g. 32k tokens x 152k vocab x 4 bytes
= 19 GiB). `ChunkedLogprobs` projects `chunk_size` positions at a time and keeps only the
target logprob, the entropy and the log-partition per position; its backward recomputes each
chunk's logits and forms d(logits) = g * (onehot(target) - softmax) directly, so no (T x V)
tensor is stored and autograd never walks the softmax graph. Softmax arithmetic is float32
(float64 stays float64); the projection runs in the hidden states' dtype (bf16 under autocast).

Only positions that are trained on need logprobs: `packed_logprobs(..., only=mask)` projects
just those (prompt and tool tokens are skipped), as TRL's fused LM head also does.

`HEAD_KERNELS` names the LM head + logprob implementations: "torch" (this module, any
device) and the fused kernels of fused_logprobs.py; `pick_head_kernel` resolves "auto".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from sandgym.train import fused_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int, inv_temp: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        acc = _acc_dtype(hidden.dtype)
        w = weight.to(hidden.dtype)
        lp = torch.empty(n, dtype=acc, device=hidden.device)
        ent = torch.empty(n, dtype=acc, device=hidden.device)
        logz = torch.empty(n, dtype=acc, device=hidden.device)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            logits = (hidden[s:e] @ w.t()).to(acc)
            if inv_temp != 1.0:
                logits.mul_(inv_temp)
            z = torch.logsumexp(logits, dim=-1)
            logits.sub_(z[:, None])  # now log-softmax, in place
            lp[s:e] = logits.gather(-1, targets[s:e, None]).squeeze(-1)
            p = logits.exp()
            ent[s:e] = -(p * logits).sum(-1)
            logz[s:e] = z
            del logits, p
        ctx.save_for_backward(hidden, weight, targets, logz)
        ctx.chunk = chunk
        ctx.inv_temp = inv_temp
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, grad_lp: torch.Tensor, grad_ent: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, targets, logz = ctx.saved_tensors
        chunk, inv_temp = ctx.chunk, ctx.inv_temp
        acc = logz.dtype
        w = weight.to(hidden.dtype)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        g_all = grad_lp.to(acc)
        n = hidden.shape[0]
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            g = g_all[s:e]
            logits = (hidden[s:e] @ w.t()).to(acc)
            if inv_temp != 1.0:
                logits.mul_(inv_temp)
            # d lp / d logits = onehot(target) - softmax; scaled by the incoming gradient.
            d = logits.sub_(logz[s:e, None]).exp_().mul_(-g[:, None])
            d.scatter_add_(-1, targets[s:e, None], g[:, None])
            if inv_temp != 1.0:
                d.mul_(inv_temp)
            d16 = d.to(hidden.dtype)
            if grad_h is not None:  # needed
                grad_h[s:e] = d16 @ w
            if grad_w is not None:
                grad_w.add_((d16.t() @ hidden[s:e]).to(acc))
            del logits, d, d16
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: (N, H); targets: (N,). Returns (logprobs (N,) with grad, entropy (N,) no grad),
    float32 (float64 for float64 inputs)."""
    if getattr(lm_head, "bias", None) is not None:
        raise NotImplementedError("LM heads with a bias are not supported")
    if hidden.shape[0] == 0:
        z = hidden.new_zeros(0, dtype=_acc_dtype(hidden.dtype))
        return z + hidden.sum() * 0, z  # keep the graph connected for an all-masked micro-batch
    if hidden.dtype == torch.float32 and torch.is_autocast_enabled(hidden.device.type):
        hidden = hidden.to(torch.get_autocast_dtype(hidden.device.type))
    lp, ent = ChunkedLogprobs.apply(hidden, lm_head.weight, targets, chunk_size, 1.0 / temperature)
    return lp, ent.detach()


HeadLogprobs = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


# (hidden (N, H), lm_head, targets (N,), chunk_size, temperature) -> (logprobs, entropy or None)
HEAD_KERNELS: dict[str, HeadLogprobs] = {
    "torch": chunked_logprobs,
    "trl": fused_logprobs.trl_logprobs,
    "liger": fused_logprobs.liger_logprobs,
}
# What "auto" picks on CUDA, first available, as measured on an H100 (forward + backward of
# 16,384 positions x 151,936 vocabulary: trl 37 ms, liger 45 ms, torch 122 ms; and trl alone
# also gives the entropy). CPU always gets "torch": TRL's CPU fallback is no faster there.
AUTO_ORDER_CUDA = ("trl", "liger", "torch")


def available_head_kernels(device: torch.device | str) -> list[str]:
    dev = torch.device(device)
    return [k for k in HEAD_KERNELS if k == "torch" or fused_logprobs.available(k, dev)]


def pick_head_kernel(device: torch.device | str, requested: str = "auto") -> str:
    dev = torch.device(device)
    avail = available_head_kernels(dev)
    if requested == "auto":
        return next(k for k in AUTO_ORDER_CUDA if k in avail) if dev.type == "cuda" else "torch"
    if requested not in avail:
        raise ValueError(f"logprob kernel {requested!r} not available on {dev}; available: {avail}")
    return requested


def decoder(model: torch.nn.Module) -> Any:
    """A transformers causal LM's decoder (embeddings + layers + final norm, no LM head)."""
    get_decoder = getattr(model, "get_decoder", None)
    return get_decoder() if get_decoder is not None else model.model


def packed_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    targets: torch.Tensor,
    kernel: str,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    only: torch.Tensor | None = None,
    head_kernel: str = "torch",
    prefix_len: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (T,) of `targets` for a packed row through a transformers causal LM whose
    attention implementation is sandgym's varlen one (see attention.use_varlen), and the
    entropy (T,), or None where `head_kernel` computes none. With `only` (a (T,) mask),
    positions outside it are not projected and read 0. `prefix_len`: the row starts with a
    prefix its sequences share (batch.MicroBatch.prefix_len)."""
    from sandgym.train.attention import packed_forward_kwargs

    # Indices first: nonzero() waits for the device, better before the forward is queued.
    idx = only.nonzero().squeeze(-1) if only is not None else None
    out = decoder(model)(
        input_ids=input_ids,
        position_ids=position_ids,
        use_cache=False,
        **packed_forward_kwargs(cu_seqlens, max_seqlen, kernel, prefix_len=prefix_len),
    )
    hidden = out.last_hidden_state[0]
    head = model.get_output_embeddings()
    fn = HEAD_KERNELS[head_kernel]
    if idx is None:
        return fn(hidden, head, targets, chunk_size, temperature)
    lp_sel, ent_sel = fn(hidden.index_select(0, idx), head, targets.index_select(0, idx), chunk_size, temperature)
    lp = lp_sel.new_zeros(targets.shape[0]).index_put((idx,), lp_sel)
    ent = ent_sel.new_zeros(targets.shape[0]).index_put((idx,), ent_sel) if ent_sel is not None else None
    return lp, ent
