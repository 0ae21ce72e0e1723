"""Tiny offline models for CPU runs and tests: a byte-level tokenizer built locally and a
randomly initialised Qwen2-shaped causal LM. Nothing is downloaded.

The tokenizer has 256 byte tokens plus ChatML specials, and a chat template that renders past
assistant messages verbatim (so multi-turn prompts extend earlier turns' tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, Qwen-style. Tool calls are rendered as JSON inside <tool_call> tags; tool results as
# role "tool". The assistant generation prompt is "<|im_start|>assistant\n".
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{% if m.get('tool_calls') %}{% for tc in m['tool_calls'] %}"
    "<tool_call>{\"name\": \"{{ tc['function']['name'] }}\", \"arguments\": "
    "{% if tc['function']['arguments'] is string %}{{ tc['function']['arguments'] }}"
    "{% else %}{{ tc['function']['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer() -> Any:
    """A PreTrainedTokenizerFast over bytes: ids 0..255 are the byte-level symbols, then the
    specials. Built in memory with `tokenizers` (no files, no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    # Order symbols by the byte they stand for, so id == byte value (readable in tests).
    byte_to_sym = {b: s for b, s in _bytes_to_unicode().items()}
    assert set(byte_to_sym.values()) == set(alphabet)
    vocab = {byte_to_sym[b]: b for b in range(256)}
    for i, s in enumerate(SPECIALS):
        vocab[s] = 256 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-unicode map (what ByteLevel uses).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_qwen2(
    vocab_size: int = 264,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    eos_token_id: int = 258,
    pad_token_id: int = 256,
) -> Any:
    """A randomly initialised Qwen2ForCausalLM (float32)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def qwen2_05b_config(vocab_size: int = 151936) -> Any:
    """Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV heads, ffn 4864)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 2,
        bos_token_id=None,
    )


def save_tiny(path: str | Path, **kwargs: Any) -> Path:
    """Write a tiny model + byte tokenizer in Hugging Face format (loadable by
    from_pretrained, and by vLLM for the issue-9 checks)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model = tiny_qwen2(**kwargs)
    model.save_pretrained(p)
    byte_tokenizer().save_pretrained(p)
    return p
