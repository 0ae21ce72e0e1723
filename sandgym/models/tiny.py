"""A Qwen2-shaped causal LM with random weights and a byte-level BPE tokenizer trained here.

Nothing is downloaded: the tokenizer is trained with `tokenizers` on text the project ships
(its own source and docs), the weights are random. The result is saved in Hugging Face
format (config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json with a ChatML chat template) so that transformers and vLLM both load
it from a local folder. Sizes: "tiny" for CPU tests, "0.5b" (Qwen2.5-0.5B's transformer
shape with the local vocabulary) for GPU speed measurements.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD, BOS_CHAT, EOS = SPECIALS

# ChatML as Qwen writes it; past assistant turns render verbatim, so a multi-turn prompt
# extends the previous turn's tokens.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
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


def qwen2_config(size: Size, vocab_size: int, eos_token_id: int, pad_token_id: int, **overrides: Any) -> Any:
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
