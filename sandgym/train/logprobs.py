"""Token logprobs (and entropy) from hidden states, in chunks.

Full logits for a packed batch would be T x V floats (e.g. 32k tokens x 152k vocab x 4 bytes
= 19 GiB). We project `chunk_size` positions at a time and keep only the target logprob and
the entropy; under autograd each chunk is checkpointed, so its logits are recomputed in the
backward pass instead of being stored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # softmax in fp32; fp64 stays fp64 (tests)
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    tgt = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lp = tgt - logz
    with torch.no_grad():
        p = torch.softmax(logits, dim=-1)
        ent = logz - (p * logits).sum(-1)
    return lp, ent


def chunked_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: (T, H); targets: (T,). Returns (logprobs (T,) float32 with grad, entropy (T,) no grad)."""
    weight = lm_head.weight
    bias = getattr(lm_head, "bias", None)
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for s in range(0, hidden.shape[0], chunk_size):
        h = hidden[s : s + chunk_size]
        t = targets[s : s + chunk_size]
        if need_grad:
            lp, ent = checkpoint(_chunk_logprobs, h, weight, bias, t, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, weight, bias, t, temperature)
        lps.append(lp)
        ents.append(ent.detach())
    return torch.cat(lps), torch.cat(ents)


def packed_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    targets: torch.Tensor,
    kernel: str,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs of `targets` for a packed row through a transformers causal LM whose attention
    implementation is sandgym's varlen one (see attention.use_varlen)."""
    from sandgym.train.attention import packed_forward_kwargs

    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    out = base(
        input_ids=input_ids,
        position_ids=position_ids,
        use_cache=False,
        **packed_forward_kwargs(cu_seqlens, max_seqlen, kernel),
    )
    hidden = out.last_hidden_state[0]
    return chunked_logprobs(hidden, model.get_output_embeddings(), targets, chunk_size, temperature)
