"""Each loss variant against a plain float64 loop over tokens (values and gradients), with the
batch split across micro-batches to check that accumulation reproduces the whole-step loss."""

from __future__ import annotations

import math

import pytest
import torch

from sandgym.train.config import LossConfig
from sandgym.train.loss import StepNormalizer, grpo_loss


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


def _is_weight(s: dict, cfg: LossConfig, t: int) -> float:
    """The importance weight of token t of sequence s, from scratch."""
    if cfg.is_correction == "none":
        return 1.0
    toks = [u for u in range(len(s["lp"])) if s["mask"][u] != 0]
    d = [float(s["old"][u]) - float(s["inf"][u]) for u in toks]
    if cfg.is_level == "token":
        rho = math.exp(float(s["old"][t]) - float(s["inf"][t]))
    elif cfg.is_level == "sequence":
        rho = math.exp(sum(d))
    else:
        rho = math.exp(sum(d) / len(d))
    inside = cfg.is_low <= rho <= cfg.is_high
    if cfg.is_correction == "tis":
        return min(rho, cfg.is_high)
    if cfg.is_correction == "mis":
        return rho if inside else 0.0
    return 1.0 if inside else 0.0


def _reference(seqs: list[dict], lps: list[list[torch.Tensor]], cfg: LossConfig) -> torch.Tensor:
    """Token-by-token float64 loop; lps[i][t] are 0-d tensors requiring grad."""
    total_tokens = sum(float(s["mask"].sum()) for s in seqs)
    loss = torch.zeros((), dtype=torch.float64)
    for s, lp_list in zip(seqs, lps):
        seq_sum = torch.zeros((), dtype=torch.float64)
        toks = [t for t in range(len(lp_list)) if s["mask"][t] != 0]
        n_tok = float(len(toks))
        a = s["adv"]
        if cfg.policy_loss == "gspo":
            # One term per sequence: s_i = exp(mean log ratio); counted once per token so
            # that the sequence normalisation's per-token mean gives it back.
            mean_lr = sum((lp_list[t] - float(s["old"][t]) for t in toks), torch.zeros((), dtype=torch.float64)) / max(n_tok, 1.0)
            si = torch.exp(mean_lr)
            seq_term = torch.maximum(-a * si, -a * torch.clamp(si, 1 - cfg.gspo_eps_low, 1 + cfg.gspo_eps_high))
        for t in toks:
            lp = lp_list[t]
            old = float(s["old"][t])
            if cfg.policy_loss == "gspo":
                term = seq_term
            elif cfg.policy_loss == "cispo":
                w = min(math.exp(float(lp.detach()) - old), 1 + cfg.cispo_eps_high)
                term = -a * w * lp
            else:
                ratio = torch.exp(lp - old)
                clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
                term = torch.maximum(-a * ratio, -a * clipped)
            term = term * _is_weight(s, cfg, t)
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
    LossConfig(normalization="constant", constant_length=16),  # Dr. GRPO's normalisation
    LossConfig(normalization="token", eps_low=0.1, eps_high=0.5),  # asymmetric clipping
    LossConfig(normalization="token", kl_beta=0.3),
    LossConfig(normalization="sequence", is_correction="tis", is_high=1.5),
    LossConfig(normalization="constant", constant_length=8, is_correction="tis", kl_beta=0.1, eps_low=0.3, eps_high=0.2),
    # IcePop: token-level masking outside [low, high], the weight kept inside
    LossConfig(normalization="token", is_correction="mis", is_low=0.5, is_high=1.5),
    LossConfig(normalization="token", is_correction="tis", is_level="sequence", is_high=1.5),
    LossConfig(normalization="sequence", is_correction="mis", is_level="sequence", is_low=0.25, is_high=3.0),
    LossConfig(normalization="token", is_correction="reject", is_level="geometric", is_low=0.8, is_high=1.2),
    LossConfig(policy_loss="gspo", normalization="sequence", gspo_eps_low=0.05, gspo_eps_high=0.08),
    LossConfig(policy_loss="gspo", normalization="sequence", gspo_eps_low=0.05, gspo_eps_high=0.08, kl_beta=0.2,
               is_correction="tis", is_level="sequence", is_high=1.5),
    LossConfig(policy_loss="gspo", normalization="sequence", gspo_eps_low=0.1, gspo_eps_high=0.1,
               is_correction="reject", is_level="geometric", is_low=0.8, is_high=1.2),
    LossConfig(policy_loss="cispo", normalization="token", cispo_eps_high=0.3),
    LossConfig(policy_loss="cispo", normalization="token", cispo_eps_high=0.3, is_correction="mis", is_low=0.5, is_high=1.5, kl_beta=0.1),
]


def _cfg_id(c: LossConfig) -> str:
    return (
        f"{c.policy_loss}-{c.normalization}-el{c.eps_low}-eh{c.eps_high}-kl{c.kl_beta}-"
        f"{c.is_correction}-{c.is_level}-{c.is_low}-{c.is_high}"
    )


@pytest.mark.parametrize("cfg", VARIANTS, ids=_cfg_id)
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
    sums: dict[str, float] = {}
    for m, mask, si in zip(micro, masks, sidx):
        lp = torch.cat([leaves[i] for i in m])
        adv = torch.cat([torch.full((len(seqs[i]["lp"]),), seqs[i]["adv"], dtype=torch.float64) for i in m])
        loss, stats = grpo_loss(
            lp, flat(m, "old"), adv, mask, si, norm, cfg, inference_logprobs=flat(m, "inf"), ref_logprobs=flat(m, "ref")
        )
        loss.backward()
        total = total + loss.detach()
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    assert float(total) == pytest.approx(float(ref.detach()), rel=1e-10, abs=1e-12)
    for leaf, rg in zip(leaves, ref_grads):
        torch.testing.assert_close(leaf.grad, rg, rtol=1e-9, atol=1e-12)
    # The batch is built so that some tokens are clipped and some are not: both branches of
    # the clipping are exercised (and of the masks, where a correction masks).
    assert 0 < sums["clip_sum"] < sums["tokens"], sums
    if cfg.is_correction in ("mis", "reject"):
        assert 0 < sums["is_masked_sum"] < sums["tokens"], sums
    # The train/inference mismatch KL is reported whatever the correction.
    k3 = sum(
        math.exp(float(s["old"][t] - s["inf"][t])) - 1 - float(s["old"][t] - s["inf"][t])
        for s in seqs
        for t in range(len(s["lp"]))
        if s["mask"][t] != 0
    )
    assert sums["mismatch_kl_sum"] == pytest.approx(k3, rel=1e-10)


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
    with pytest.raises(ValueError, match="is_correction = 'tis' needs"):
        grpo_loss(lp, lp, lp, m, si, norm, LossConfig(is_correction="tis"))
    with pytest.raises(ValueError, match="reference logprobs"):
        grpo_loss(lp, lp, lp, m, si, norm, LossConfig(kl_beta=0.1))


def test_dr_grpo_matches_float64_loop() -> None:
    """Dr. GRPO end to end: rewards -> advantages without the std division -> constant
    normalisation; against a loop over groups and tokens."""
    from sandgym.core.stats import group_advantages

    cfg = LossConfig(normalization="constant", constant_length=12, scale_advantages_by_std=False)
    groups = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.25, 0.0, 0.0]]
    g = torch.Generator().manual_seed(3)
    lens = [4, 6, 3, 5, 7, 2, 4, 6]
    lps = [(-torch.rand(n, generator=g, dtype=torch.float64) * 2).requires_grad_(True) for n in lens]
    olds = [lp.detach() + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) for lp, n in zip(lps, lens)]
    advs = [a for grp in groups for a in group_advantages(grp, normalize_std=cfg.scale_advantages_by_std)]
    # Reference: the group mean subtracted, no std; each token's clipped term; / (N x L).
    ref = torch.zeros((), dtype=torch.float64)
    ref_leaves = [[lp[t].detach().clone().requires_grad_(True) for t in range(n)] for lp, n in zip(lps, lens)]
    for gi, grp in enumerate(groups):
        mean = sum(grp) / len(grp)
        for j, r in enumerate(grp):
            i = gi * len(grp) + j
            a = r - mean
            for t in range(lens[i]):
                ratio = torch.exp(ref_leaves[i][t] - float(olds[i][t]))
                ref = ref + torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.28)) / (len(lens) * 12)
    ref.backward()
    lp = torch.cat(lps)
    mask = torch.ones_like(lp)
    si = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    adv = torch.cat([torch.full((n,), a, dtype=torch.float64) for n, a in zip(lens, advs)])
    norm = StepNormalizer.from_masks([mask], [si], len(lens))
    loss, _ = grpo_loss(lp, torch.cat(olds), adv, mask, si, norm, cfg)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-10)
    for leaf, row in zip(lps, ref_leaves):
        torch.testing.assert_close(leaf.grad, torch.stack([x.grad for x in row]), rtol=1e-9, atol=1e-12)


def test_from_sequences_equals_from_masks() -> None:
    from sandgym.train.batch import Sequence, pack

    seqs = [
        Sequence(input_ids=[1, 2, 3, 4, 5], loss_mask=[0, 0, 1, 1, 0], inference_logprobs=[0.0] * 5, advantage=1.0),
        Sequence(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], inference_logprobs=[0.0] * 3, advantage=-1.0),
        Sequence(input_ids=[7, 8, 9, 10], loss_mask=[0, 1, 0, 1], inference_logprobs=[0.0] * 4, advantage=0.5),
    ]
    mbs = pack(seqs, 8)
    a = StepNormalizer.from_masks([mb.mask for mb in mbs], [mb.seq_index for mb in mbs], len(seqs))
    b = StepNormalizer.from_sequences(seqs)
    assert a.total_tokens == b.total_tokens == 6
    assert torch.equal(a.seq_tokens, b.seq_tokens)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"policy_loss": "gspo", "normalization": "token"}, "loss.normalization"),
        ({"policy_loss": "gspo", "normalization": "sequence", "is_correction": "tis"}, "loss.is_level"),
        ({"is_correction": "mis", "is_low": 2.0, "is_high": 1.5}, "loss.is_low"),
    ],
)
def test_conflicting_loss_options_name_the_key(kwargs: dict, key: str) -> None:
    from sandgym.train.config import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        LossConfig(**kwargs)


def test_unknown_loss_key_is_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="tis\n  Extra inputs are not permitted"):
        LossConfig.model_validate({"tis": True})
