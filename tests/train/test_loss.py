"""Each loss variant against a plain float64 loop over tokens (values and gradients), with the
batch split across micro-batches to check that accumulation reproduces the whole-step loss."""

from __future__ import annotations

import math

import pytest
import torch

from sandgym.train.loss import LossConfig, StepNormalizer, grpo_loss


def _make_batch(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    lens = [5, 9, 3, 7]
    seqs = []
    for i, n in enumerate(lens):
        lp = -torch.rand(n, generator=g, dtype=torch.float64) * 3
        seqs.append(
            {
                "lp": lp,
                # old/inference/reference differ from lp enough to cross both clip bounds
                "old": lp + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1.2,
                "inf": lp + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 2.0,
                "ref": lp + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 0.8,
                "mask": (torch.rand(n, generator=g) > 0.3).to(torch.float64),
                "adv": float(torch.randn(1, generator=g)) * (1 if i % 2 else -1),
            }
        )
    return {"seqs": seqs}


def _reference(seqs: list[dict], lps: list[list[torch.Tensor]], cfg: LossConfig) -> torch.Tensor:
    """Token-by-token float64 loop; lps[i][t] are 0-d tensors requiring grad."""
    total_tokens = sum(float(s["mask"].sum()) for s in seqs)
    loss = torch.zeros((), dtype=torch.float64)
    for s, lp_list in zip(seqs, lps):
        seq_sum = torch.zeros((), dtype=torch.float64)
        n_tok = 0.0
        for t, lp in enumerate(lp_list):
            if s["mask"][t] == 0:
                continue
            n_tok += 1
            old = float(s["old"][t])
            a = s["adv"]
            ratio = torch.exp(lp - old)
            clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
            term = torch.maximum(-a * ratio, -a * clipped)
            if cfg.tis:
                term = term * min(math.exp(old - float(s["inf"][t])), cfg.tis_cap)
            if cfg.kl_beta > 0:
                d = float(s["ref"][t]) - lp
                term = term + cfg.kl_beta * (torch.exp(d) - d - 1)
            seq_sum = seq_sum + term
        if cfg.normalization == "token":
            loss = loss + seq_sum / total_tokens
        elif cfg.normalization == "sequence":
            loss = loss + (seq_sum / max(n_tok, 1.0)) / len(seqs)
        else:
            loss = loss + seq_sum / (len(seqs) * cfg.constant_length)
    return loss


VARIANTS = [
    LossConfig(normalization="token"),
    LossConfig(normalization="sequence"),
    LossConfig(normalization="constant", constant_length=16),
    LossConfig(normalization="token", eps_low=0.1, eps_high=0.5),  # asymmetric clipping
    LossConfig(normalization="token", kl_beta=0.3),
    LossConfig(normalization="sequence", tis=True, tis_cap=1.5),
    LossConfig(normalization="constant", constant_length=8, tis=True, kl_beta=0.1, eps_low=0.3, eps_high=0.2),
]


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: f"{c.normalization}-el{c.eps_low}-eh{c.eps_high}-kl{c.kl_beta}-tis{c.tis}")
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_matches_float64_loop(cfg: LossConfig, seed: int) -> None:
    seqs = _make_batch(seed)["seqs"]  # type: ignore[index]
    # Reference: scalar leaves per token.
    ref_leaves = [[s["lp"][t].clone().requires_grad_(True) for t in range(len(s["lp"]))] for s in seqs]
    ref = _reference(seqs, ref_leaves, cfg)
    ref.backward()
    ref_grads = [torch.stack([x.grad if x.grad is not None else torch.zeros((), dtype=torch.float64) for x in row]) for row in ref_leaves]

    # Implementation: flat tensors, split into two micro-batches (seq 0,2 | 1,3).
    leaves = [s["lp"].clone().requires_grad_(True) for s in seqs]
    micro = [[0, 2], [1, 3]]

    def flat(idx: list[int], key: str) -> torch.Tensor:
        return torch.cat([seqs[i][key] for i in idx])

    masks = [flat(m, "mask") for m in micro]
    sidx = [torch.cat([torch.full((len(seqs[i]["lp"]),), i) for i in m]) for m in micro]
    norm = StepNormalizer.from_masks(masks, sidx, len(seqs))
    total = torch.zeros((), dtype=torch.float64)
    clip_sum = 0.0
    for m, mask, si in zip(micro, masks, sidx):
        lp = torch.cat([leaves[i] for i in m])
        adv = torch.cat([torch.full((len(seqs[i]["lp"]),), seqs[i]["adv"], dtype=torch.float64) for i in m])
        loss, stats = grpo_loss(
            lp, flat(m, "old"), adv, mask, si, norm, cfg, inference_logprobs=flat(m, "inf"), ref_logprobs=flat(m, "ref")
        )
        loss.backward()
        total = total + loss.detach()
        clip_sum += stats["clip_sum"]
    assert float(total) == pytest.approx(float(ref.detach()), rel=1e-10, abs=1e-12)
    for leaf, rg in zip(leaves, ref_grads):
        torch.testing.assert_close(leaf.grad, rg, rtol=1e-9, atol=1e-12)
    # The batch is built so that some tokens are clipped: the clipping branch is exercised.
    assert clip_sum > 0


def test_ratio_one_gives_policy_gradient() -> None:
    """On-policy (old == new): gradient of the token-normalised loss is -A/N per token."""
    lp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    si = torch.tensor([0, 0, 1])
    norm = StepNormalizer.from_masks([mask], [si], 2)
    loss, stats = grpo_loss(lp, lp.detach(), adv, mask, si, norm, LossConfig())
    loss.backward()
    torch.testing.assert_close(lp.grad, -adv / 3)
    assert stats["clip_sum"] == 0


def test_missing_inputs_are_errors() -> None:
    lp = torch.zeros(2, dtype=torch.float64)
    m = torch.ones(2, dtype=torch.float64)
    si = torch.zeros(2, dtype=torch.long)
    norm = StepNormalizer.from_masks([m], [si], 1)
    with pytest.raises(ValueError, match="tis=True"):
        grpo_loss(lp, lp, lp, m, si, norm, LossConfig(tis=True))
    with pytest.raises(ValueError, match="reference logprobs"):
        grpo_loss(lp, lp, lp, m, si, norm, LossConfig(kl_beta=0.1))
