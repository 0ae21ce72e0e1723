"""The parts of the trainer's vLLM backend that run without vLLM (this machine has none): the
clear error when a config asks for vllm, the engine settings, the weights handed to the engine
and the in-place load check. The engine itself runs on the device
(benchmarks/vllm_device.py, which drives VLLMBackend; scripts/device/README.md)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sandgym.models.tiny import byte_tokenizer, qwen2_config, tiny_qwen2
from sandgym.train.backends import vllm as vb

needs_no_vllm = pytest.mark.skipif(vb.vllm_available(), reason="vllm is installed here: the no-vllm error path cannot be seen")


@needs_no_vllm
def test_require_vllm_names_what_is_missing_and_the_alternative() -> None:
    err = vb.vllm_import_error()
    assert err is not None and "vllm" in err
    with pytest.raises(RuntimeError, match=r"backend.kind = 'vllm' but vllm cannot be imported") as ei:
        vb.require_vllm()
    assert "backend.kind = 'hf'" in str(ei.value)


@needs_no_vllm
def test_config_asking_for_vllm_fails_clearly_before_writing_anything(tmp_path: Any) -> None:
    from sandgym.train.config import TrainConfig
    from sandgym.train.trainer import make_backend

    cfg = TrainConfig.model_validate({"backend": {"kind": "vllm"}, "output": {"dir": str(tmp_path)}})
    model, tok = tiny_qwen2(), byte_tokenizer()
    with pytest.raises(RuntimeError, match="vllm cannot be imported"):
        make_backend(cfg, model, tok, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="vllm cannot be imported"):
        vb.VLLMBackend("unused", tok).start()
    # "auto" without vllm (and on CPU) is the transformers backend.
    auto = make_backend(TrainConfig.model_validate({"backend": {"kind": "auto"}}), model, tok, torch.device("cpu"))
    assert auto.name == "hf"


def test_engine_settings_are_the_ones_run_on_the_device() -> None:
    # Set at import of the backend module, before vLLM reads its environment.
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    b = vb.VLLMBackend("/m", None, gpu_memory_utilization=0.3, max_model_len=656, max_num_seqs=512)
    assert b.engine_kwargs() == {
        "model": "/m",
        "dtype": "bfloat16",
        "enable_sleep_mode": True,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 656,
        "seed": 0,
        "max_num_seqs": 512,
        "enforce_eager": False,
    }


def test_not_started_backend_says_so_and_sleep_wake_close_are_harmless() -> None:
    b = vb.VLLMBackend("/m", None)
    with pytest.raises(RuntimeError, match="not started"):
        _ = b.base_url
    with pytest.raises(RuntimeError, match="not started"):
        b.update_weights(tiny_qwen2())
    b.sleep()
    b.wake()
    b.close()
    assert b.asleep is False and b.weights_version == 0


def test_engine_weights_are_the_trainers_parameters_once_each() -> None:
    model = tiny_qwen2(num_layers=2)
    w = vb.engine_weights(model)
    names = [n for n, _ in w]
    sd = model.state_dict()
    assert len(names) == len(set(names)) == 2 * 12 + 2  # per layer q/k/v (w+b), o, gate, up, down, 2 norms
    assert set(names) <= set(sd)
    # Tied embeddings: the head is the embedding, listed once (vLLM's Qwen2 ties it too).
    assert set(sd) - set(names) == {"lm_head.weight"}
    params = dict(model.named_parameters())
    for n, t in w:  # the trainer's tensors themselves: no copy, no autograd history
        assert t.data_ptr() == params[n].data_ptr() and not t.requires_grad


# vLLM's Qwen2 load_weights folds these Hugging Face names into fused engine tensors
# (vllm/model_executor/models/qwen2.py stacked_params_mapping).
_STACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def _engine_name(hf_name: str) -> str:
    parts = hf_name.split(".")
    return ".".join(_STACKED.get(p, p) for p in parts)


def test_trainer_names_cover_the_engine_layout_measured_on_the_device() -> None:
    with torch.device("meta"):  # the device model's shape, no memory
        model = __import__("transformers").Qwen2ForCausalLM(qwen2_config("0.5b", 8192, eos_token_id=8191, pad_token_id=8190))
    engine = {_engine_name(n) for n, _ in vb.engine_weights(model)}
    # The device run loaded 170 engine parameters from this model (benchmarks/RESULTS.md).
    assert len(engine) == 170
    assert "model.layers.0.self_attn.qkv_proj.bias" in engine and "model.layers.23.mlp.gate_up_proj.weight" in engine


class _LoadsByName(torch.nn.Module):
    """Stands in for vLLM's model (not runnable here) with its load_weights contract: consume
    (name, tensor) pairs, copy each into the parameter of that name with a dtype cast, return
    the set of names loaded."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        done = set()
        with torch.no_grad():
            for n, t in weights:
                params["inner." + n].copy_(t)
                done.add("inner." + n)
        return done


class _GraphWrapper:
    def __init__(self, m: torch.nn.Module) -> None:
        self._m = m

    def unwrap(self) -> torch.nn.Module:
        return self._m


def test_load_into_copies_every_parameter_in_place_with_the_dtype_cast() -> None:
    trainer = tiny_qwen2(seed=1)
    engine = _LoadsByName(tiny_qwen2(seed=2).to(torch.bfloat16))
    before = {n: p.data_ptr() for n, p in engine.named_parameters()}
    n = vb.load_into(_GraphWrapper(engine), vb.engine_weights(trainer))  # unwrapped like a CUDA-graph wrapper
    assert n == len(before) == 26
    src = dict(trainer.named_parameters())
    for name, p in engine.named_parameters():
        assert p.dtype == torch.bfloat16 and p.data_ptr() == before[name]  # same buffers, in place
        assert torch.equal(p, src[name.removeprefix("inner.")].detach().to(torch.bfloat16))


def test_load_into_refuses_a_partial_update() -> None:
    engine = _LoadsByName(tiny_qwen2(seed=2))
    weights = [(n, t) for n, t in vb.engine_weights(tiny_qwen2(seed=1)) if n != "model.norm.weight"]
    with pytest.raises(RuntimeError, match=r"left 1 engine parameters unset: \['inner.model.norm.weight'\]"):
        vb.load_into(engine, weights)


def test_sampled_logprobs_pick_the_sampled_token_at_each_position() -> None:
    lp = SimpleNamespace
    steps = [{5: lp(logprob=-0.25)}, {7: lp(logprob=-2.0), 3: lp(logprob=-0.5)}]  # top-k may add others
    assert vb.sampled_logprobs([5, 7], steps) == [-0.25, -2.0]
    assert vb.sampled_logprobs([5], None) == []
