"""Packed varlen attention and chunked logprobs against unpacked, unchunked references."""

from __future__ import annotations

import math

import pytest
import torch

from sandgym.models.tiny import tiny_qwen2
from sandgym.train.attention import ATTN_IMPL, available_kernels, pick_kernel, use_varlen, varlen_causal_attention
from sandgym.train.logprobs import chunked_logprobs, packed_logprobs


def _naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int]) -> torch.Tensor:
    """Float64 loops: causal softmax attention inside each sequence, GQA by head grouping."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.zeros_like(q, dtype=torch.float64)
    for s, e in zip(cu[:-1], cu[1:]):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(s, e):
                scores = [float(q[i, h].double() @ k[j, kh].double()) / math.sqrt(d) for j in range(s, i + 1)]
                mx = max(scores)
                w = [math.exp(x - mx) for x in scores]
                z = sum(w)
                out[i, h] = sum((wj / z) * v[s + jj, kh].double() for jj, wj in enumerate(w))
    return out


def test_cpu_kernel_selection() -> None:
    assert available_kernels("cpu") == ["sdpa"]  # flash_attn / torch varlen are CUDA-only
    assert pick_kernel("cpu") == "sdpa"
    with pytest.raises(ValueError, match="not available"):
        pick_kernel("cpu", "torch_varlen")


# [0, 5, 6, 13]: lengths close enough for one padded batched call; [0, 1, 2, 22]: one long
# sequence, so the per-sequence loop.
@pytest.mark.parametrize("cu", [[0, 5, 6, 13], [0, 1, 2, 22]])
def test_varlen_sdpa_matches_naive_loops_with_gqa(cu: list[int]) -> None:
    g = torch.Generator().manual_seed(0)
    t = cu[-1]
    q = torch.randn(t, 4, 8, generator=g)
    k = torch.randn(t, 2, 8, generator=g)
    v = torch.randn(t, 2, 8, generator=g)
    width = max(b - a for a, b in zip(cu, cu[1:]))
    out = varlen_causal_attention(q, k, v, torch.tensor(cu, dtype=torch.int32), width, kernel="sdpa")
    ref = _naive_attention(q, k, v, cu)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_match_full_softmax(temperature: float) -> None:
    g = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=False).double()
    hidden = torch.randn(23, 16, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (23,), generator=g)
    lp, ent = chunked_logprobs(hidden, head, targets, chunk_size=5, temperature=temperature)
    (lp * torch.linspace(-1, 1, 23, dtype=torch.float64)).sum().backward()
    g_hidden, g_w = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad = None
    head.weight.grad = None
    logits = head(hidden) / temperature
    full = torch.log_softmax(logits, -1)
    ref = full.gather(-1, targets[:, None]).squeeze(-1)
    (ref * torch.linspace(-1, 1, 23, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(lp, ref.float().to(lp.dtype), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_hidden, hidden.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(g_w, head.weight.grad, rtol=1e-6, atol=1e-8)
    ref_ent = -(full.exp() * full).sum(-1)
    torch.testing.assert_close(ent, ref_ent.to(ent.dtype), rtol=1e-5, atol=1e-6)


def test_packed_model_logprobs_equal_unpacked_forwards() -> None:
    """A packed row through the varlen path gives each sequence the logprobs (and gradients)
    it gets alone through transformers' own SDPA attention."""
    torch.manual_seed(0)
    model = tiny_qwen2(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64).double()
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 256, (n,), generator=g) for n in (6, 11, 4)]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    cu = torch.tensor([0, 6, 17, 21], dtype=torch.int32)
    targets = torch.cat([torch.cat([s[1:], torch.zeros(1, dtype=torch.long)]) for s in seqs])

    ref_lps = []
    model.set_attn_implementation("sdpa")
    for s in seqs:
        logits = model(input_ids=s[None]).logits[0]
        ref_lps.append(torch.log_softmax(logits, -1)[:-1].gather(-1, s[1:, None]).squeeze(-1))
    ref_total = sum(x.sum() for x in ref_lps)
    ref_total.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    use_varlen(model)
    assert model.config._attn_implementation == ATTN_IMPL
    lp, _ = packed_logprobs(model, ids, pos, cu, 11, targets, kernel="sdpa", chunk_size=7)
    valid = torch.ones(21, dtype=torch.bool)
    valid[[5, 16, 20]] = False  # last position of each sequence has no target
    got = lp[valid]
    torch.testing.assert_close(got, torch.cat(ref_lps).to(got.dtype), rtol=1e-6, atol=1e-6)
    got.sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[n], rtol=1e-5, atol=1e-8, msg=n)


def test_packed_logprobs_only_trained_positions() -> None:
    """`only=mask` projects just the masked positions: same values there, zeros elsewhere,
    same gradients as the full projection restricted to the mask."""
    torch.manual_seed(0)
    model = tiny_qwen2(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64).double()
    use_varlen(model)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (1, 15), generator=g)
    pos = torch.cat([torch.arange(9), torch.arange(6)])[None]
    cu = torch.tensor([0, 9, 15], dtype=torch.int32)
    targets = torch.randint(0, 256, (15,), generator=g)
    mask = torch.zeros(15, dtype=torch.bool)
    mask[[3, 4, 5, 10, 11]] = True
    full, _ = packed_logprobs(model, ids, pos, cu, 9, targets, kernel="sdpa", chunk_size=4)
    (full * mask).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    part, ent = packed_logprobs(model, ids, pos, cu, 9, targets, kernel="sdpa", chunk_size=4, only=mask)
    torch.testing.assert_close(part[mask], full[mask].detach())
    assert bool((part[~mask] == 0).all()) and bool((ent[~mask] == 0).all()) and bool((ent[mask] > 0).all())
    part.sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], msg=n)


# Rests of close lengths (one padded batched call) and of far ones (one call each).
@pytest.mark.parametrize("rests", [[5, 6, 4], [1, 2, 19]])
def test_shared_prefix_attention_matches_each_sequence_alone(rests: list[int]) -> None:
    """[prefix][rest 1][rest 2]...: each rest's output equals that of prefix + rest run as one
    sequence, and the prefix's equals its own (naive float64 loops, GQA)."""
    g = torch.Generator().manual_seed(3)
    p = 7
    t = p + sum(rests)
    q, k, v = torch.randn(t, 4, 8, generator=g), torch.randn(t, 2, 8, generator=g), torch.randn(t, 2, 8, generator=g)
    cu = [0, p]
    for n in rests:
        cu.append(cu[-1] + n)
    out = varlen_causal_attention(q, k, v, torch.tensor(cu, dtype=torch.int32), max(rests), kernel="sdpa", prefix_len=p)
    assert out.shape == q.shape
    for s, e in zip(cu[:-1], cu[1:]):
        rows = list(range(p)) + (list(range(s, e)) if s else [])
        ref = _naive_attention(q[rows], k[rows], v[rows], [0, len(rows)])
        got = out[s:e].double()
        assert float((got - ref[-(e - s) :]).norm() / ref.norm()) < 1e-5


def test_shared_prefix_attention_needs_the_sdpa_kernel() -> None:
    x = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="sdpa"):
        varlen_causal_attention(x, x, x, torch.tensor([0, 2, 4], dtype=torch.int32), 2, kernel="flash_attn", prefix_len=2)


def test_packing_with_a_shared_prefix_gives_the_same_logprobs_and_gradients() -> None:
    """A step's sequences packed with their common prefix once: every trained token's logprob
    and every parameter's gradient as packed without sharing, from fewer tokens."""
    from sandgym.train.batch import Sequence, pack

    torch.manual_seed(0)
    model = tiny_qwen2(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64).double()
    use_varlen(model)
    g = torch.Generator().manual_seed(4)
    tools = torch.randint(0, 256, (40,), generator=g).tolist()  # shared by every sequence
    seqs = []
    for i in range(6):
        question = torch.randint(0, 256, (5,), generator=g).tolist()
        answer = torch.randint(0, 256, (3 + 4 * i,), generator=g).tolist()
        ids = tools + question + answer
        seqs.append(Sequence(ids, [0] * 45 + [1] * len(answer), [0.0] * len(ids), advantage=i - 2.5))

    def run(share: bool) -> tuple[dict[tuple[int, int], float], dict[str, torch.Tensor], int]:
        model.zero_grad(set_to_none=True)
        lps: dict[tuple[int, int], float] = {}
        tokens = 0
        for mb in pack(seqs, max_tokens=200, share_prefix=share):
            lp, _ = packed_logprobs(model, mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, mb.targets,
                                    kernel="sdpa", only=mb.mask > 0, prefix_len=mb.prefix_len)
            (lp * mb.mask * mb.advantages).sum().backward()
            tokens += mb.num_tokens
            trained = (mb.mask > 0).nonzero().squeeze(-1)
            for t in trained.tolist():  # keyed by (sequence, position in it)
                lps[(int(mb.seq_index[t]), int(mb.position_ids[0, t]))] = float(lp[t].detach())
        return lps, {n: p.grad.clone() for n, p in model.named_parameters()}, tokens

    plain, plain_grads, plain_tokens = run(False)
    shared, shared_grads, shared_tokens = run(True)
    assert shared.keys() == plain.keys() and len(plain) == sum(s.num_loss_tokens for s in seqs)
    for key, value in plain.items():
        assert shared[key] == pytest.approx(value, abs=1e-9), key
    # Not to float64's last bits: transformers' RMSNorm computes in float32 whatever the model's
    # dtype, and the prefix's gradient goes through it once summed instead of once per copy.
    for n, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[n], grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    assert shared_tokens < plain_tokens - 4 * 40  # the 40-token tools block once per micro-batch
