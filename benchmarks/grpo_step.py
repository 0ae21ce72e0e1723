"""One GRPO step at a realistic size, for the lent H100 (issue 6).

A Qwen2.5-0.5B-shaped model with random weights; 64 prompts x 8 completions, 128 prompt and
512 completion tokens (512 sequences, 327,680 tokens). Measures, in one process:

1. generation of the batch through sandgym's transformers backend engine (the code behind its
   OpenAI-compatible server; called directly because the device has no fastapi/uvicorn), and
   through vLLM when `import vllm` works;
2. sandgym's training step (packed varlen attention, chunked logprobs, bf16 autocast, AdamW):
   time, tokens/s, peak memory;
3. the same step (same initial weights, same token batch, same loss family: DAPO token-level,
   beta 0) through TRL's GRPOTrainer, its generation bypassed by returning our batch from
   `_generate_and_score_completions`; reported as a time ratio.

Steps are timed after warm-up steps, each with CUDA synchronisation. Results: a table on
stdout and JSON in $OUT/grpo_step.json (or --json).

    python3 benchmarks/grpo_step.py                 # the real size (GPU)
    python3 benchmarks/grpo_step.py --small         # a CPU smoke run of the same code paths
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gib(dev: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import Qwen2ForCausalLM

    from sandgym.models.tiny import qwen2_config, tiny_qwen2

    torch.manual_seed(0)
    if args.small:
        return tiny_qwen2(vocab_size=args.vocab, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
    cfg = qwen2_config("0.5b", args.vocab, eos_token_id=args.vocab - 1, pad_token_id=args.vocab - 2)
    return Qwen2ForCausalLM(cfg)


def bench_generation(model: torch.nn.Module, prompts: list[list[int]], args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    from sandgym.train.backends.base import GenRequest
    from sandgym.train.backends.hf import HFEngine

    amp = torch.bfloat16 if dev.type == "cuda" else None
    eng = HFEngine(model, None, device=dev, autocast_dtype=amp, max_batch_size=len(prompts) * args.group)
    eng.eos_ids = []  # fixed-length completions (ignore_eos), as the benchmark prescribes
    reqs = [GenRequest(prompt_ids=p, max_tokens=args.completion_len, temperature=1.0, ignore_eos=True) for p in prompts for _ in range(args.group)]
    # Warm-up on a slice (kernels, allocator), then the full batch once.
    eng.generate(reqs[: min(8, len(reqs))][:])
    reset_peak(dev)
    sync(dev)
    t0 = time.perf_counter()
    res = eng.generate(reqs)
    sync(dev)
    dt = time.perf_counter() - t0
    ntok = sum(len(r.completion_ids) for r in res)
    return {
        "backend": "sandgym hf engine (bf16 autocast, KV cache)" if amp else "sandgym hf engine (fp32)",
        "seconds": dt,
        "completion_tokens": ntok,
        "tokens_per_s": ntok / dt,
        "peak_gib": peak_gib(dev),
        "results": res,
    }


def bench_vllm(model_dir: Path, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    try:
        import vllm
    except Exception as exc:
        return {"skipped": f"vllm not importable: {type(exc).__name__}: {exc}"}
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=str(model_dir), dtype="bfloat16", gpu_memory_utilization=0.5, enforce_eager=False, max_model_len=args.prompt_len + args.completion_len + 16)
    sp = SamplingParams(n=args.group, max_tokens=args.completion_len, min_tokens=args.completion_len, ignore_eos=True, temperature=1.0, logprobs=0)
    tp = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(tp[:2], sp)
    t0 = time.perf_counter()
    outs = llm.generate(tp, sp)
    dt = time.perf_counter() - t0
    ntok = sum(len(c.token_ids) for o in outs for c in o.outputs)
    del llm
    return {"seconds": dt, "completion_tokens": ntok, "tokens_per_s": ntok / dt, "version": vllm.__version__}


def build_states(prompts: list[list[int]], gen: list[Any], args: argparse.Namespace) -> list[Any]:
    from sandgym.core.state import State, Turn, TurnTokens
    from sandgym.core.stats import group_advantages

    states = []
    g = torch.Generator().manual_seed(1)
    rewards = torch.rand(len(gen), generator=g).tolist()  # random rewards: a realistic mix of signs
    for i, r in enumerate(gen):
        p = prompts[i // args.group]
        states.append(
            State(
                example_id=i // args.group,
                rollout_index=i % args.group,
                turns=[Turn(prompt=[], completion={}, tokens=TurnTokens(prompt_ids=p, completion_ids=r.completion_ids, completion_logprobs=r.logprobs))],
                reward=rewards[i],
            )
        )
    adv = [a for i in range(0, len(gen), args.group) for a in group_advantages(rewards[i : i + args.group], normalize_std=True)]
    for s, a in zip(states, adv):
        s.advantage = a
    return states


def bench_sandgym_train(model: torch.nn.Module, states: list[Any], args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    from sandgym.train.batch import states_to_sequences
    from sandgym.train.config import ModelConfig, OptimConfig
    from sandgym.train.loss import LossConfig
    from sandgym.train.policy import PolicyTrainer

    seqs = states_to_sequences(states)
    mc = ModelConfig(attention=args.attention, gradient_checkpointing=args.grad_ckpt, logprob_chunk_size=args.chunk)
    pt = PolicyTrainer(model, mc, OptimConfig(lr=1e-6, micro_batch_tokens=args.micro_tokens), LossConfig(normalization="token"), dev)
    out: dict[str, Any] = {}
    # Kernel check on a few sequences: the chosen varlen kernel against per-sequence SDPA.
    from sandgym.train.batch import pack
    from sandgym.train.logprobs import packed_logprobs

    mb = pack(seqs[:8], 1 << 30)[0].to(dev)
    lps: dict[str, torch.Tensor] = {}
    for kern in dict.fromkeys([pt.kernel, "sdpa"]):
        try:
            with torch.no_grad(), pt._amp():
                lps[kern] = packed_logprobs(model, mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, mb.targets, kernel=kern)[0]
        except Exception as exc:
            out[f"kernel_error_{kern}"] = f"{type(exc).__name__}: {exc}"
    if pt.kernel != "sdpa" and pt.kernel in lps and "sdpa" in lps:
        m = mb.mask.bool()
        out["kernel_vs_sdpa_max_abs_logprob_diff"] = float((lps[pt.kernel] - lps["sdpa"])[m].abs().max())
    if pt.kernel not in lps:
        out["kernel_fallback"] = f"{pt.kernel} failed; using sdpa"
        pt.kernel = "sdpa"
    times = []
    metrics: dict[str, float] = {}
    for i in range(args.warmup + args.repeats):
        if i == args.warmup:
            reset_peak(dev)
        sync(dev)
        t0 = time.perf_counter()
        metrics = pt.step(seqs)
        sync(dev)
        times.append(time.perf_counter() - t0)
    timed = times[args.warmup :]
    ntok = sum(len(s) for s in seqs)
    med = sorted(timed)[len(timed) // 2]
    return out | {
        "kernel": pt.kernel,
        "seconds_median": med,
        "seconds_all": times,
        "tokens": ntok,
        "tokens_per_s": ntok / med,
        "micro_batches": metrics.get("micro_batches"),
        "peak_gib": peak_gib(dev),
        "loss_last": metrics.get("loss"),
        "inference_logprob_abs_diff": metrics.get("inference_logprob_abs_diff"),
    }


def bench_trl(init_model: torch.nn.Module, states: list[Any], args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    try:
        import trl
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except Exception as exc:
        return {"skipped": f"TRL not importable: {type(exc).__name__}: {exc}"}
    from sandgym.models.tiny import byte_tokenizer

    n = len(states)
    p_ids = torch.tensor([s.turns[0].tokens.prompt_ids for s in states], dtype=torch.long)
    c_ids = torch.tensor([s.turns[0].tokens.completion_ids for s in states], dtype=torch.long)
    adv = torch.tensor([s.advantage for s in states], dtype=torch.float32)
    per_dev = args.trl_batch
    accum = n // per_dev
    steps = args.warmup + args.repeats

    class FixedBatchGRPO(GRPOTrainer):
        """GRPOTrainer whose generation returns our pre-generated batch (so only the
        training step is compared)."""

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:  # type: ignore[override]
            d = self.accelerator.device
            return {
                "prompt_ids": p_ids.to(d),
                "prompt_mask": torch.ones_like(p_ids, device=d),
                "completion_ids": c_ids.to(d),
                "completion_mask": torch.ones_like(c_ids, device=d),
                "advantages": adv.to(d),
                "num_items_in_batch": torch.tensor(float(c_ids.numel()), device=d),
            }

    times: list[float] = []
    peak: list[float | None] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == args.warmup:
                reset_peak(dev)
            sync(dev)
            self.t0 = time.perf_counter()

        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            sync(dev)
            times.append(time.perf_counter() - self.t0)
            peak.append(peak_gib(dev))

    model = copy.deepcopy(init_model)
    tok = byte_tokenizer()
    ds = Dataset.from_dict({"prompt": [f"prompt {i}" for i in range(n // args.group * steps)]})
    conf = dict(
        output_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "trl_bench"),
        per_device_train_batch_size=per_dev,
        gradient_accumulation_steps=accum,
        num_generations=args.group,
        max_completion_length=args.completion_len,
        learning_rate=1e-6,
        beta=0.0,
        loss_type="dapo",
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=dev.type == "cuda",
        use_cpu=dev.type != "cuda",
        gradient_checkpointing=args.grad_ckpt,
        use_vllm=False,
        seed=0,
        dataloader_num_workers=0,
    )
    try:
        cfg = GRPOConfig(**conf)
        trainer = FixedBatchGRPO(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Timer()])
        trainer.train()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:], "version": trl.__version__}
    timed = times[args.warmup :]
    med = sorted(timed)[len(timed) // 2]
    ntok = int(p_ids.numel() + c_ids.numel())
    return {
        "version": trl.__version__,
        "seconds_median": med,
        "seconds_all": times,
        "tokens": ntok,
        "tokens_per_s": ntok / med,
        "per_device_train_batch_size": per_dev,
        "gradient_accumulation_steps": accum,
        "peak_gib": peak[-1] if peak else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="tiny model, small batch (CPU smoke run)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--completion-len", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--micro-tokens", type=int, default=20480, help="sandgym packing budget per micro-batch (TRL default here: 32 x 640)")
    ap.add_argument("--trl-batch", type=int, default=32, help="TRL per-device batch (sequences); 32 x 640 = 20480 tokens")
    ap.add_argument("--chunk", type=int, default=4096, help="logprob chunk (positions)")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: gen,vllm,train,trl")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.small:
        args.prompts, args.group, args.prompt_len, args.completion_len, args.vocab = 4, 4, 16, 24, 264
        args.micro_tokens, args.trl_batch, args.chunk = 96, 4, 64
    skip = set(filter(None, args.skip.split(",")))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": {k: getattr(args, k) for k in ("prompts", "group", "prompt_len", "completion_len", "vocab", "micro_tokens", "trl_batch", "chunk", "grad_ckpt")},
    }
    import transformers

    info["transformers"] = transformers.__version__
    model = make_model(args).to(dev)
    info["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    init = copy.deepcopy(model).cpu()  # TRL starts from the same weights
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, min(args.vocab, 32000), (args.prompts, args.prompt_len), generator=g).tolist()

    out: dict[str, Any] = {"info": info}
    gen = bench_generation(model, prompts, args, dev)
    out["generation"] = {k: v for k, v in gen.items() if k != "results"}
    print(f"generation: {gen['seconds']:.2f}s, {gen['tokens_per_s']:.0f} tok/s, peak {gen['peak_gib']} GiB", flush=True)
    if "vllm" not in skip:
        try:
            mdir = Path(os.environ.get("TMPDIR", "/tmp")) / "grpo_bench_model"
            vres: dict[str, Any]
            try:
                import vllm  # noqa: F401

                init.save_pretrained(mdir)
                vres = bench_vllm(mdir, prompts, args)
            except ImportError as exc:
                vres = {"skipped": f"vllm not importable: {exc}"}
        except Exception as exc:
            vres = {"error": f"{type(exc).__name__}: {exc}"}
        out["vllm"] = vres
        print(f"vllm: {vres}", flush=True)
    states = build_states(prompts, gen["results"], args)
    del gen
    if "train" not in skip:
        out["sandgym_train"] = bench_sandgym_train(model, states, args, dev)
        print(f"sandgym train: {out['sandgym_train']}", flush=True)
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if "trl" not in skip:
        out["trl_train"] = bench_trl(init.to(dev), states, args, dev)
        print(f"trl train: { {k: v for k, v in out['trl_train'].items() if k != 'traceback'} }", flush=True)
        if "traceback" in out["trl_train"]:
            print(out["trl_train"]["traceback"])
    s, t = out.get("sandgym_train"), out.get("trl_train")
    if s and t and "seconds_median" in t:
        out["ratio_trl_over_sandgym"] = t["seconds_median"] / s["seconds_median"]
    path = args.json or (os.path.join(os.environ["OUT"], "grpo_step.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(out, indent=2, default=str))
    # Short table last (the device reply carries the end of the output).
    print("\n== GRPO step benchmark ==")
    print(f"device {info['device']}  torch {info['torch']}  transformers {info['transformers']}  params {info['params_m']:.0f}M")
    g_ = out["generation"]
    print(f"generation ({g_['backend']}): {g_['seconds']:.2f} s  {g_['tokens_per_s']:.0f} tok/s  peak {g_['peak_gib']}")
    if "vllm" in out:
        print(f"vllm: {out['vllm']}")
    if s:
        print(f"sandgym train step [{s['kernel']}]: {s['seconds_median']:.2f} s  {s['tokens_per_s']:.0f} tok/s  peak {s['peak_gib']}  ({s['micro_batches']:.0f} micro-batches)")
    if t:
        if "seconds_median" in t:
            print(f"TRL {t['version']} GRPOTrainer step: {t['seconds_median']:.2f} s  {t['tokens_per_s']:.0f} tok/s  peak {t['peak_gib']}")
            print(f"ratio TRL time / sandgym time: {out['ratio_trl_over_sandgym']:.2f}")
        else:
            print(f"TRL: {t.get('skipped') or t.get('error')}")


if __name__ == "__main__":
    main()
