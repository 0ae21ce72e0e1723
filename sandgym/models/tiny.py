"""Offline Qwen2-shaped models with random weights, and their tokenizers; nothing is downloaded.

Two tokenizers share one chat template (CHAT_TEMPLATE) and the ChatML specials:
- `byte_tokenizer()`: in memory, one token per byte (ids 0..255) then the specials; what the
  trainer's `name_or_path = "tiny"` and the CPU tests use, with `tiny_qwen2()`;
- `train_tokenizer()`: a byte-level BPE trained with `tokenizers` on text the project ships
  (its own source and docs); `build()` saves it with a random model in Hugging Face format
  (config.json, model.safetensors, generation_config.json, tokenizer.json,
  tokenizer_config.json with the template inline) so that transformers and vLLM both load it
  from a local folder. Sizes: "tiny" for CPU tests, "0.5b" (Qwen2.5-0.5B's transformer
  shape with the local vocabulary) for GPU speed measurements.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD, EOS = SPECIALS[0], SPECIALS[2]

# ChatML as Qwen writes it. Tool schemas go in a leading system block; an assistant's tool
# calls are rendered as Hermes-style JSON in <tool_call> tags (what
# sandgym.train.backends.openai_server.parse_tool_calls reads back); tool results are messages
# of role "tool". Content may be a string or a list of text parts.
#
# Prefix-preserving: every message renders the same whatever follows it, and the "\n" that
# separates two blocks is written before the later one, so the rendering of messages[:k] is a
# prefix (in text and in tokens: specials split the text) of the rendering of messages, and a
# generated assistant turn ending in <|im_end|> ends exactly where the rendered message does.
# With `suffix_from=k` (an extra apply_chat_template argument) only messages[k:] are rendered,
# with no tools block: the text that extends the rendering of messages[:k]. (Separators are
# written as {{ '\n' }}: transformers renders with trim_blocks, which drops a newline that
# follows a block tag.)
CHAT_TEMPLATE = (
    "{% set start = suffix_from if suffix_from is defined else 0 %}"
    "{% if tools and start == 0 %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>{% endif %}"
    "{% for m in messages %}{% if loop.index0 >= start %}"
    "{% if tools or not loop.first %}{{ '\\n' }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{% if m.get('tool_calls') %}{% for tc in m['tool_calls'] %}"
    "<tool_call>{\"name\": \"{{ tc['function']['name'] }}\", \"arguments\": "
    "{% if tc['function']['arguments'] is string %}{{ tc['function']['arguments'] }}"
    "{% else %}{{ tc['function']['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{% if tools or messages %}{{ '\\n' }}{% endif %}<|im_start|>assistant\n{% endif %}"
)

Size = Literal["tiny", "small", "0.5b"]

# (hidden, intermediate, layers, heads, kv_heads); "0.5b" is Qwen2.5-0.5B's shape.
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (64, 128, 2, 4, 2),
    "small": (256, 704, 4, 4, 2),
    "0.5b": (896, 4864, 24, 14, 2),
}


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def corpus_files(root: Path | None = None) -> list[Path]:
    """The project's own text: package sources and Markdown docs, sorted (training is
    deterministic for a given input order)."""
    root = root or project_root()
    files = sorted((root / "sandgym").rglob("*.py"))
    files += sorted(p for p in root.glob("*.md"))
    files += sorted((root / "benchmarks").glob("*.md")) if (root / "benchmarks").is_dir() else []
    return [f for f in files if f.is_file() and "__pycache__" not in f.parts]


def _lines(files: Iterable[Path]) -> Iterator[str]:
    for f in files:
        yield from f.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def train_tokenizer(
    files: Iterable[Path] | None = None, vocab_size: int = 4096, texts: Iterable[str] | None = None
) -> Any:
    """Train a byte-level BPE tokenizer (GPT-2/Qwen style) and wrap it for transformers.

    Every byte has a token (initial alphabet), so any text encodes; specials come first (ids
    0..2) and are never split."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    source = texts if texts is not None else _lines(corpus_files() if files is None else files)
    tok.train_from_iterator(source, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None, unk_token=None,
        model_max_length=32768,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


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
        eos_token=EOS,
        pad_token=PAD,
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
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


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
    """A randomly initialised Qwen2ForCausalLM (float32), in memory; the default vocabulary,
    end and pad ids are byte_tokenizer()'s (264 rounded from 259, <|im_end|>, <|endoftext|>)."""
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


def qwen2_config(size: Size, vocab_size: int, eos_token_id: int, pad_token_id: int, **overrides: Any) -> Any:
    """A Qwen2Config of one of SHAPES (Qwen2.5's rope and tied embeddings), `overrides` last."""
    from transformers import Qwen2Config

    hidden, inter, layers, heads, kv = SHAPES[size]
    kw: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    kw.update(overrides)
    cfg = Qwen2Config(**kw)
    cfg.architectures = ["Qwen2ForCausalLM"]
    return cfg


def build(
    out_dir: str | Path,
    size: Size = "tiny",
    vocab_size: int = 4096,
    seed: int = 0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    files: Iterable[Path] | None = None,
    init_std: float | None = None,
) -> Path:
    """Train the tokenizer, initialise the model randomly and save both under `out_dir`.

    `init_std` overrides the initializer range (a larger one gives peakier, less uniform
    next-token distributions, so sampled text is not pure noise)."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(files, vocab_size=vocab_size)
    # Model vocabulary: the tokenizer's, rounded up to a multiple of 64 (kernel-friendly);
    # the spare rows are never produced by the tokenizer.
    n = len(tok)
    model_vocab = -(-n // 64) * 64
    extra = {"initializer_range": init_std} if init_std is not None else {}
    cfg = qwen2_config(size, model_vocab, tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(PAD), **extra)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, do_sample=True, temperature=1.0
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    _portable_tokenizer_config(out)
    meta = {"size": size, "seed": seed, "tokenizer_vocab": n, "model_vocab": model_vocab,
            "params": sum(p.numel() for p in model.parameters())}
    (out / "sandgym_model.json").write_text(json.dumps(meta, indent=1))
    return out


def _portable_tokenizer_config(out: Path) -> None:
    # transformers 5 writes its own class name (TokenizersBackend) and puts the template in
    # chat_template.jinja; PreTrainedTokenizerFast and an inline template are read by every
    # transformers release that vLLM and the device image carry.
    p = out / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    p.write_text(json.dumps(cfg, indent=2))


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Build an offline Qwen2-shaped model + BPE tokenizer")
    ap.add_argument("out_dir")
    ap.add_argument("--size", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    p = build(a.out_dir, a.size, a.vocab_size, a.seed, a.dtype, a.device)
    print((p / "sandgym_model.json").read_text())


if __name__ == "__main__":
    main()
