"""`model.compile_layers`: decoder layers compiled in place (inductor on CPU here, as on CUDA)
give the eager step's loss, gradient norm and new weights, and the same model still generates
with a KV cache afterwards (a shared transformers backend runs through the compiled layers)."""

from __future__ import annotations

import pytest
import torch

from sandgym.models.tiny import tiny_qwen2
from sandgym.train.config import ConfigError, LossConfig, ModelConfig, OptimConfig, TrainConfig
from sandgym.train.policy import PolicyTrainer

from .test_fused_logprobs import _sequences


def _step(compiled: bool) -> tuple[dict[str, float], dict[str, torch.Tensor], torch.nn.Module]:
    torch.manual_seed(0)
    model = tiny_qwen2(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    pt = PolicyTrainer(
        model,
        ModelConfig(compile_layers=compiled, logprob_chunk_size=16),
        # eps well above the gradients' rounding: Adam's first step is about lr * sign(grad),
        # so with the default eps a near-zero gradient whose sign rounding flips (inductor's
        # kernels sum in another order than eager's, by CPU) moved its weight by 2 * lr.
        OptimConfig(lr=1e-2, eps=1e-3, micro_batch_tokens=40),
        LossConfig(normalization="token"),
        torch.device("cpu"),
    )
    m = pt.step(_sequences())
    return m, {k: v.detach().clone() for k, v in model.state_dict().items()}, model


def test_compiled_layers_step_and_generate_like_eager() -> None:
    (me, we, eager), (mc, wc, compiled) = _step(False), _step(True)
    layer = compiled.get_decoder().layers[0]
    assert getattr(layer, "_compiled_call_impl", None) is not None  # really compiled
    for key in ("loss", "grad_norm", "train_tokens"):
        assert mc[key] == pytest.approx(me[key], rel=1e-4, abs=1e-6), key
    for k in we:
        torch.testing.assert_close(wc[k], we[k], rtol=1e-4, atol=1e-5, msg=k)
    prompt = torch.tensor([[5, 17, 42, 99]])
    outs = [m.generate(prompt, max_new_tokens=6, do_sample=False) for m in (eager, compiled)]
    assert outs[0].shape == (1, 10)
    assert torch.equal(outs[0], outs[1])


def test_compile_layers_refused_with_several_processes() -> None:
    with pytest.raises(ConfigError, match="model.compile_layers"):
        TrainConfig.model_validate({"model": {"compile_layers": True}, "distributed": {"nproc": 2}})
