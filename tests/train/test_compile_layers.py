"""`model.compile_layers`: decoder layers compiled in place (inductor on CPU here, as on CUDA)
give the eager step's loss, gradient norm and new weights; a transformers backend sharing the
model decodes with it afterwards, the same greedy tokens as the eager model's, through the
layers run eagerly (nothing compiled while it decodes), per thread (sandgym/train/compiled.py)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch._dynamo.utils import counters

from sandgym.models.tiny import byte_tokenizer, tiny_qwen2
from sandgym.train.backends.base import GenRequest
from sandgym.train.backends.hf import HFEngine
from sandgym.train.compiled import CompiledForward, eager_layers
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


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def test_compiled_layers_step_and_generate_like_eager() -> None:
    (me, we, eager), graphs = _step(False), _graphs()
    mc, wc, compiled = _step(True)
    assert isinstance(compiled.get_decoder().layers[0].forward, CompiledForward)
    assert _graphs() > graphs  # really compiled
    for key in ("loss", "grad_norm", "train_tokens"):
        assert mc[key] == pytest.approx(me[key], rel=1e-4, abs=1e-6), key
    for k in we:
        torch.testing.assert_close(wc[k], we[k], rtol=1e-4, atol=1e-5, msg=k)
    req = GenRequest(prompt_ids=[5, 17, 42, 99], max_tokens=6, temperature=0.0, ignore_eos=True)
    graphs = _graphs()
    outs = [HFEngine(m, byte_tokenizer()).generate([req])[0].completion_ids for m in (eager, compiled)]
    assert _graphs() == graphs  # decoding compiled nothing
    assert len(outs[0]) == 6 and outs[0] == outs[1]


def test_eager_layers_is_per_thread() -> None:
    """A thread decoding (inside `eager_layers`) leaves the trainer's thread compiled."""
    inside, release = threading.Event(), threading.Event()

    def decoding() -> None:
        with eager_layers():
            inside.set()
            release.wait(60)

    t = threading.Thread(target=decoding)
    t.start()
    try:
        assert inside.wait(60)
        ran_eagerly: list[bool] = []  # the body's own Python runs only when not compiled

        def body(x: torch.Tensor) -> torch.Tensor:
            ran_eagerly.append(not torch.compiler.is_compiling())
            return x * 2 + 1

        f, graphs = CompiledForward(body), _graphs()
        assert torch.equal(f(torch.ones(3)), torch.full((3,), 3.0))
        assert _graphs() == graphs + 1 and ran_eagerly == [False]  # compiled here, the other thread eager
        with eager_layers():
            assert torch.equal(f(torch.ones(5)), torch.full((5,), 3.0))
        assert ran_eagerly == [False, True] and _graphs() == graphs + 1  # inside: the body, as it is
    finally:
        release.set()
        t.join()


def test_compile_layers_refused_with_several_processes() -> None:
    with pytest.raises(ConfigError, match="model.compile_layers"):
        TrainConfig.model_validate({"model": {"compile_layers": True}, "distributed": {"nproc": 2}})
