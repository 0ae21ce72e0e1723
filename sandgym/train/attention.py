"""Packed (varlen) causal attention for training, plugged into transformers models.

Training packs several sequences into one row without padding; attention must not cross
sequence boundaries. The kernel, in order of preference:

1. `flash_attn.flash_attn_varlen_func` (the `flash_attn` package, CUDA);
2. `torch.nn.attention.varlen.varlen_attn` (torch >= 2.10; CUDA only: on CPU it raises);
3. per-sequence `scaled_dot_product_attention` (any device; no (T x T) mask is built): one
   batched call over right-padded sequences when their lengths are close, else a loop.

A row may start with a prefix that all its sequences share (`prefix_len`, batch.pack's
`share_prefix`): every sequence attends to it, then causally to its own tokens. Only the
`sdpa` kernel does this (the flash kernels take no such layout).

We register one attention function with transformers under ATTN_IMPL. Calls that carry
`cu_seq_lens_q` (training) take the varlen path; calls without it (generation with a KV cache
and a padding mask, as the built-in inference backend does on the same model object) go to
transformers' own SDPA implementation, so one model serves both.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

ATTN_IMPL = "sandgym_varlen"


@functools.cache
def _flash_attn_func() -> Any:
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # not installed, or built against another torch
        return None
    return flash_attn_varlen_func


@functools.cache
def _torch_varlen_func() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:
        return None
    return varlen_attn


@functools.cache
def _varlen_params() -> frozenset[str]:
    import inspect

    return frozenset(inspect.signature(_torch_varlen_func()).parameters)


def available_kernels(device: torch.device | str) -> list[str]:
    """Kernels usable on `device`, best first. The torch varlen and flash_attn kernels are
    CUDA-only (checked on torch 2.13 CPU: varlen_attn raises NotImplementedError)."""
    dev = torch.device(device)
    out: list[str] = []
    if dev.type == "cuda":
        if _flash_attn_func() is not None:
            out.append("flash_attn")
        if _torch_varlen_func() is not None:
            out.append("torch_varlen")
    out.append("sdpa")
    return out


def pick_kernel(device: torch.device | str, requested: str = "auto") -> str:
    avail = available_kernels(device)
    if requested == "auto":
        return avail[0]
    if requested not in avail:
        raise ValueError(f"attention kernel {requested!r} not available on {device}; available: {avail}")
    return requested


def takes_shared_prefix(kernel: str) -> bool:
    """Whether `kernel` attends rows that start with a prefix their sequences share (sdpa only)."""
    return kernel == "sdpa"


def varlen_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
    kernel: str = "sdpa",
    prefix_len: int = 0,
) -> torch.Tensor:
    """Causal attention over packed sequences.

    q: (T, Hq, D); k, v: (T, Hkv, D); cu_seqlens: (N+1,) int32 offsets. Returns (T, Hq, D).
    Grouped-query attention (Hkv < Hq) is handled by every kernel. With `prefix_len`, the
    first segment (cu_seqlens[0:2]) is a prefix every later segment continues.
    """
    hq, hkv = q.shape[1], k.shape[1]
    if prefix_len:
        if not takes_shared_prefix(kernel):
            raise ValueError(f"a shared prefix needs the sdpa attention kernel, not {kernel!r}")
        return _sdpa(q, k, v, cu_seqlens, scale, prefix_len)
    if kernel == "flash_attn":
        fn = _flash_attn_func()
        return fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale=scale, causal=True)
    if kernel == "torch_varlen":
        fn = _torch_varlen_func()
        params = _varlen_params()
        cu = cu_seqlens.to(torch.int32)
        kw: dict[str, Any] = {}
        # The signature moved between torch releases: causal is `is_causal` in early ones,
        # `window_size=(-1, 0)` later; GQA and `scale` are not in every release.
        if "window_size" in params:
            kw["window_size"] = (-1, 0)
        else:
            kw["is_causal"] = True
        if scale is not None and "scale" in params:
            kw["scale"] = scale
        if hq != hkv:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                k = k.repeat_interleave(hq // hkv, dim=1)
                v = v.repeat_interleave(hq // hkv, dim=1)
        return fn(q, k, v, cu, cu, max_seqlen, max_seqlen, **kw)
    if kernel != "sdpa":
        raise ValueError(f"unknown attention kernel {kernel!r}")
    return _sdpa(q, k, v, cu_seqlens, scale, 0)


# Eager under compiled layers (sandgym/train/compiled.py): the sequences' bounds become Python
# ints here, which breaks the graph anyway, and dynamo compiled the fragments between that
# break and two more (a 2-layer model's compiled step: 11 graphs, 9 with this; the
# compiled-layers test 73 -> 56-61 CPU-s with inductor's cache cold). The flash kernels are
# left to dynamo as before.
@torch.compiler.disable
def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float | None, prefix_len: int
) -> torch.Tensor:
    """The sdpa kernel's packed attention; with `prefix_len`, over a shared prefix first."""
    bounds = cu_seqlens.tolist()
    if prefix_len:
        if bounds[1] != prefix_len:
            raise ValueError("the shared prefix must be the first segment of cu_seqlens")
        return _sdpa_shared_prefix(q, k, v, prefix_len, bounds[1:], scale)
    lens = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    if len(lens) > 1 and len(lens) * max(lens) <= 2 * q.shape[0]:
        return _sdpa_padded(q, k, v, lens, scale)
    out = torch.empty_like(q)
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        if e <= s:
            continue
        # (1, H, L, D) views of one sequence; is_causal needs no materialized mask.
        qs = q[s:e].transpose(0, 1).unsqueeze(0)
        ks = k[s:e].transpose(0, 1).unsqueeze(0)
        vs = v[s:e].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        out[s:e] = o.squeeze(0).transpose(0, 1)
    return out


def _sdpa_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], scale: float | None) -> torch.Tensor:
    """Per-sequence causal SDPA as one batched call: each sequence right-padded to the
    longest. Exact for the real tokens (under a causal mask they never see the padding after
    them), and on CPU much cheaper than a loop over sequences, whose slices each cost a
    full-size gradient buffer in backward. Used when padding at most doubles the tokens."""
    n, width = len(lens), max(lens)
    idx = _pad_index(lens, width, q.device)
    qs, ks, vs = (_padded(x, idx, n, width) for x in (q, k, v))
    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2).reshape(n * width, q.shape[1], q.shape[2]).index_select(0, idx)


def _pad_index(lens: list[int], width: int, device: torch.device) -> torch.Tensor:
    """Where each packed sequence's tokens go among len(lens) right-padded rows of `width`."""
    return torch.cat([torch.arange(i * width, i * width + n) for i, n in enumerate(lens)]).to(device)


def _padded(x: torch.Tensor, idx: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """Packed tokens x (T, H, D) placed at `idx` of n right-padded sequences: (n, H, width, D)."""
    buf = x.new_zeros(n * width, x.shape[1], x.shape[2]).index_copy(0, idx, x)
    return buf.view(n, width, x.shape[1], x.shape[2]).transpose(1, 2)


def _sdpa_shared_prefix(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, bounds: list[int], scale: float | None
) -> torch.Tensor:
    """Causal attention over a prefix, then over sequences that each continue it: (T, H, D)
    rows laid out as [prefix][rest 1][rest 2]..., `bounds` the offsets of the rests. Each
    rest's queries see all prefix keys and their own keys causally, exactly as if the prefix
    were copied in front of each; its keys and values are computed once, and their gradients
    sum over the sequences (autograd through expand)."""
    p = prefix_len
    gqa = q.shape[1] != k.shape[1]

    def heads(x: torch.Tensor) -> torch.Tensor:  # (L, H, D) -> (1, H, L, D)
        return x.transpose(0, 1).unsqueeze(0)

    head = F.scaled_dot_product_attention(heads(q[:p]), heads(k[:p]), heads(v[:p]), is_causal=True, scale=scale, enable_gqa=gqa)
    out = [head.squeeze(0).transpose(0, 1)]
    lens = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    # Close lengths: one batched call over rests right-padded to the longest (padding sits after
    # every real token, so the causal part of the mask keeps it unseen); else one call each.
    chunks = [list(range(len(lens)))] if len(lens) * max(lens) <= 2 * sum(lens) else [[i] for i in range(len(lens))]
    for chunk in chunks:
        n, width = len(chunk), max(lens[i] for i in chunk)
        idx = _pad_index([lens[i] for i in chunk], width, q.device)
        rows = torch.cat([torch.arange(bounds[i], bounds[i + 1]) for i in chunk]).to(q.device)
        qs, ks, vs = (_padded(x.index_select(0, rows), idx, n, width) for x in (q, k, v))
        keys = torch.cat([heads(k[:p]).expand(n, -1, -1, -1), ks], dim=2)
        values = torch.cat([heads(v[:p]).expand(n, -1, -1, -1), vs], dim=2)
        allowed = torch.ones(width, p + width, dtype=torch.bool, device=q.device)
        allowed[:, p:] = torch.ones(width, width, dtype=torch.bool, device=q.device).tril()
        o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=allowed, scale=scale, enable_gqa=gqa)
        out.append(o.transpose(1, 2).reshape(n * width, q.shape[1], q.shape[2]).index_select(0, idx))
    return torch.cat(out, dim=0)


def _hf_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError("packed varlen attention expects batch size 1 (all sequences in one row)")
    kernel = kwargs.get("sandgym_kernel") or "sdpa"
    # transformers hands us (B, H, T, D); kernels want (T, H, D).
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    if kernel != "sdpa" and q.dtype == torch.float32:
        # Flash kernels take 16-bit inputs only; under autocast, rotary embeddings promote q/k
        # back to float32 (as transformers' own flash integration also corrects for).
        dev = q.device.type
        target = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.bfloat16
        q, k, v = q.to(target), k.to(target), v.to(target)
    out = varlen_causal_attention(
        q, k, v, cu, int(kwargs["max_length_q"]), scale=scaling, kernel=kernel, prefix_len=int(kwargs.get("sandgym_prefix_len") or 0)
    )
    return out.unsqueeze(0), None  # (B, T, H, D), as transformers' attention functions return


@functools.cache
def register() -> str:
    """Register ATTN_IMPL with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPL, _hf_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        # Generation through the same model builds ordinary SDPA masks; training passes
        # precomputed (None) masks and never reaches this.
        AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)
    except ImportError:  # older transformers without mask interfaces
        pass
    return ATTN_IMPL


def use_varlen(model: PreTrainedModel) -> None:
    """Switch a transformers model to the packed-attention implementation."""
    register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTN_IMPL)
    else:
        model.config._attn_implementation = ATTN_IMPL


def packed_forward_kwargs(
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    kernel: str,
    num_layer_types: tuple[str, ...] = ("full_attention", "sliding_attention"),
    prefix_len: int = 0,
) -> dict[str, Any]:
    """Keyword arguments for `model.model(...)` that route attention to the varlen kernel.

    `attention_mask` as a dict of Nones makes transformers skip building (T x T) masks."""
    return {
        "sandgym_prefix_len": prefix_len,
        "attention_mask": {name: None for name in num_layer_types},
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
        "sandgym_kernel": kernel,
    }
