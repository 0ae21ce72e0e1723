"""The offline model builder: a BPE tokenizer trained on the project's files and a random
Qwen2 model, saved and loaded back through transformers' Auto classes (as vLLM loads them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sandgym.models import tiny


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.build(tmp_path_factory.mktemp("tiny"), size="tiny", vocab_size=600, seed=1, dtype="float32")


def test_saved_files_are_hf_format(built: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (built / name).is_file(), name
    cfg = json.loads((built / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    tcfg = json.loads((built / "tokenizer_config.json").read_text())
    assert tcfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>" in tcfg["chat_template"]
    meta = json.loads((built / "sandgym_model.json").read_text())
    assert meta["tokenizer_vocab"] == 600 and meta["model_vocab"] == 640  # rounded up to 64


def test_tokenizer_learned_merges_and_round_trips(built: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    assert len(tok) == 600
    text = "def rollout(self, state):\n    return résumé ✓ 日本\t\x00"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # byte-level: any string round-trips
    # BPE learned from the project's Python: a common keyword is fewer tokens than bytes.
    assert len(tok.encode("    return self", add_special_tokens=False)) < len("    return self")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2


def test_chat_template_extends_previous_turn(built: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    msgs = [{"role": "user", "content": "add 2 and 3"}]
    first = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert first.endswith("<|im_start|>assistant\n")
    msgs2 = msgs + [{"role": "assistant", "content": "5"}, {"role": "user", "content": "times 2?"}]
    second = tok.apply_chat_template(msgs2, add_generation_prompt=True, tokenize=False)
    assert second.startswith(first + "5<|im_end|>\n")


def test_model_loads_and_generates(built: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    ids = tok("import torch", return_tensors="pt").input_ids
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 640)
    assert torch.isfinite(logits).all()
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids.shape[1] + 5 and out.shape[1] > ids.shape[1]


def test_same_seed_same_weights(tmp_path: Path, built: Path) -> None:
    from safetensors.torch import load_file

    again = tiny.build(tmp_path / "again", size="tiny", vocab_size=600, seed=1, dtype="float32")
    a, b = load_file(built / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (built / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()
