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


# One conversation with everything the template renders: a system prompt, content as text
# parts, an assistant tool call (arguments as a JSON string and as an object), a tool result,
# a final answer.
_CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "what is "}, {"type": "text", "text": "6*7?"}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(6*7)"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "42\n"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "python", "arguments": {"code": "1"}}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "1"},
    {"role": "assistant", "content": "42"},
]
_TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]


def _tokenizers(built: Path) -> list:
    from transformers import AutoTokenizer

    return [tiny.byte_tokenizer(), AutoTokenizer.from_pretrained(built)]


def test_one_chat_template_renders_tool_calls_and_results(built: Path) -> None:
    for tok in _tokenizers(built):
        text = tok.apply_chat_template(_CONVERSATION, tools=_TOOLS, tokenize=False)
        assert text.startswith('<|im_start|>system\n# Tools\n[{"type": "function"')
        assert "\n<|im_start|>user\nwhat is 6*7?<|im_end|>" in text
        assert '<|im_start|>assistant\n<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call><|im_end|>' in text
        assert '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>' in text
        assert "\n<|im_start|>tool\n42\n<|im_end|>" in text
        assert text.endswith("\n<|im_start|>assistant\n42<|im_end|>")
        assert "<tool_call>" not in tok.apply_chat_template(_CONVERSATION[:2], tokenize=False)


def _ids(tok, messages: list, **kw) -> list[int]:
    return tok(tok.apply_chat_template(messages, tokenize=False, **kw), add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("tools", [None, _TOOLS])
def test_chat_template_is_prefix_preserving_and_renders_suffixes(built: Path, tools: list | None) -> None:
    for tok in _tokenizers(built):
        full = _ids(tok, _CONVERSATION, tools=tools)
        for k in range(len(_CONVERSATION) + 1):
            head = _ids(tok, _CONVERSATION[:k], tools=tools) if k else []  # transformers renders no empty chat
            assert full[: len(head)] == head, k
            # Only the new messages, as the ids that extend the first k.
            assert head + _ids(tok, _CONVERSATION, tools=tools, suffix_from=k) == full, k
            if not k:
                continue
            prompt = _ids(tok, _CONVERSATION[:k], tools=tools, add_generation_prompt=True)
            assert head + _ids(tok, _CONVERSATION[:k], tools=tools, suffix_from=k, add_generation_prompt=True) == prompt, k
            if k < len(_CONVERSATION) and _CONVERSATION[k]["role"] == "assistant":
                # A generated turn ends at <|im_end|>: prompt + completion is the rendering
                # of the conversation through that turn, token for token.
                through = _ids(tok, _CONVERSATION[: k + 1], tools=tools)
                assert through[: len(prompt)] == prompt and through[-1] == tok.eos_token_id, k
