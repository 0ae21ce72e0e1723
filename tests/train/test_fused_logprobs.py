"""The LM head + logprob kernel switch (`model.logprob_kernel`): "auto" is sandgym's PyTorch
path on CPU, CUDA-only kernels are refused on CPU by name, and TRL's fused LM head (run here
through its torch-tile fallback, the same autograd function and tiling as on CUDA) gives the
PyTorch path's logprobs, entropy, gradients and training step."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from sandgym.core.state import State, Turn, TurnTokens
from sandgym.models.tiny import tiny_qwen2
from sandgym.train.batch import states_to_sequences
from sandgym.train.config import LossConfig, ModelConfig, OptimConfig
from sandgym.train.logprobs import HEAD_KERNELS, available_head_kernels, pick_head_kernel
from sandgym.train.policy import PolicyTrainer


def test_cpu_head_kernel_selection() -> None:
    avail = available_head_kernels("cpu")
    assert avail[0] == "torch" and "trl" in avail and "liger" not in avail  # liger is Triton on CUDA only
    assert pick_head_kernel("cpu") == "torch"  # auto: the PyTorch path on CPU
    assert pick_head_kernel("cpu", "trl") == "trl"
    with pytest.raises(ValueError, match="'liger' not available on cpu"):
        pick_head_kernel("cpu", "liger")
    with pytest.raises(ValidationError):
        ModelConfig(logprob_kernel="fast")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trl_head_matches_torch_head(temperature: float) -> None:
    g = torch.Generator().manual_seed(4)
    head = torch.nn.Linear(24, 300, bias=False)
    hidden = torch.randn(37, 24, generator=g) * 2
    targets = torch.randint(0, 300, (37,), generator=g)
    coef = torch.randn(37, generator=g)
    out = {}
    for name in ("torch", "trl"):
        h = hidden.clone().requires_grad_()
        head.weight.grad = None
        lp, ent = HEAD_KERNELS[name](h, head, targets, 8, temperature)
        assert ent is not None and not ent.requires_grad
        (lp * coef).sum().backward()
        out[name] = (lp.detach(), ent, h.grad, head.weight.grad.clone())
    full = torch.log_softmax(head(hidden).double() / temperature, -1)
    torch.testing.assert_close(out["torch"][0].double(), full.gather(-1, targets[:, None]).squeeze(-1), rtol=1e-5, atol=1e-5)
    for a, b in zip(out["trl"], out["torch"]):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-4, atol=1e-5)


def test_trl_head_empty_micro_batch_keeps_graph() -> None:
    head = torch.nn.Linear(8, 20, bias=False)
    h = torch.randn(0, 8, requires_grad=True)
    lp, ent = HEAD_KERNELS["trl"](h, head, torch.zeros(0, dtype=torch.long))
    assert lp.shape == (0,) and ent is not None and ent.shape == (0,)
    lp.sum().backward()  # an all-masked micro-batch still backpropagates
    assert h.grad is not None and h.grad.shape == (0, 8)


def _sequences() -> list:
    g = torch.Generator().manual_seed(6)
    states = []
    for i, adv in enumerate([1.0, -0.5, 0.25, -0.75]):
        p = torch.randint(0, 256, (5 + i,), generator=g).tolist()
        c1 = torch.randint(0, 256, (4 + 2 * i,), generator=g).tolist()
        tool = torch.randint(0, 256, (3,), generator=g).tolist()
        c2 = torch.randint(0, 256, (6,), generator=g).tolist()
        turns = [
            Turn(prompt=[], completion={}, tokens=TurnTokens(prompt_ids=p, completion_ids=c1)),
            Turn(prompt=[], completion={}, tokens=TurnTokens(prompt_ids=p + c1 + tool, completion_ids=c2)),
        ]
        states.append(State(example_id=i // 2, rollout_index=i % 2, turns=turns, reward=adv, advantage=adv))
    return states_to_sequences(states)


def test_policy_step_same_with_trl_and_torch_heads() -> None:
    """The config switch end to end: one optimizer step on multi-turn sequences (tool tokens
    masked) gives the same loss, entropy, gradient norm and new weights with either head."""
    seqs = _sequences()
    results = {}
    for name in ("torch", "trl"):
        torch.manual_seed(0)
        model = tiny_qwen2(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        pt = PolicyTrainer(
            model,
            ModelConfig(logprob_kernel=name, logprob_chunk_size=16),
            OptimConfig(lr=1e-2, micro_batch_tokens=40),
            LossConfig(normalization="token"),
            torch.device("cpu"),
        )
        assert pt.head_kernel == name
        m = pt.step(seqs)
        assert m["micro_batches"] > 1
        after = {k: v.detach().clone() for k, v in model.state_dict().items()}
        assert max(float((after[k] - before[k]).abs().max()) for k in after) > 1e-3  # the step moved the weights
        results[name] = (m, after)
    (mt, wt), (mf, wf) = results["torch"], results["trl"]
    for key in ("loss", "entropy", "grad_norm", "train_tokens"):
        assert mf[key] == pytest.approx(mt[key], rel=1e-4, abs=1e-6), key
    for k in wt:
        torch.testing.assert_close(wf[k], wt[k], rtol=1e-4, atol=1e-5, msg=k)
