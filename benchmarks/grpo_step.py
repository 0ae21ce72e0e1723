"""One GRPO training step at a realistic size: sandgym vs TRL's GRPOTrainer, on one GPU.

A Qwen2.5-0.5B-shaped model with random weights; 64 prompts x 8 completions, 128 prompt
tokens. Two batches, each run by every variant in the same process:

- uniform: 512 completions of exactly 512 tokens (327,680 tokens, 262,144 trained);
- variable: multi-turn rollouts cut at random lengths: each completion holds 1-3 model turns
  with tool results (16-64 tokens, loss mask 0) between them, 32-512 tokens in all. sandgym
  packs the real tokens; TRL gets the same tokens padded as its trainer pads a generation
  batch (completions right-padded to the longest, `tool_mask` 0 on tool tokens).

Sections (each guarded, so one failure does not lose the rest; an overall time budget skips
what would not fit):

1. LM head + logprob (+ entropy) alone, forward + backward on 16,384 trained positions: the
   PyTorch path and each fused kernel available (sandgym.train.fused_logprobs), with their
   agreement against the PyTorch path;
2. sandgym's step (PolicyTrainer: packed varlen attention, bf16 autocast, fused AdamW) with
   each LM head kernel, and TRL's step on a copy of the same initial weights and the same
   tokens (its generation replaced by the batch; loss "dapo", beta 0, bf16, 32 x 16);
3. a torch.profiler profile of one sandgym step with the PyTorch head (top CUDA kernels);
4. optionally, sandgym's fastest head with torch.compile'd decoder layers on each batch
   (--compile-layers), and on the uniform batch with liger-kernel's RMSNorm/SwiGLU/RoPE
   patched into the model (--liger-layers; last: liger patches transformers' Qwen2 module
   for the rest of the process).

Timing: warm-up steps, then the median of timed steps, each bracketed by CUDA
synchronisation. MFU = model FLOPs / time / 989e12 (H100 SXM dense bf16), model FLOPs =
6 * N_body * T_all + 6 * V * H * T_loss + 6 * L * d_attn * sum(s_i^2): N_body the parameters
outside the (tied) embedding, T_all all tokens, T_loss the trained tokens (the LM head is only
needed there), s_i each sequence's real length (causal attention, forward + backward). Both
trainers are credited the same useful FLOPs: padding and recomputation are not counted.

    python3 benchmarks/grpo_step.py                   # the real size (GPU)
    python3 benchmarks/grpo_step.py --small           # a CPU smoke run of the same code paths

Results: a table on stdout (last) and JSON in $OUT/grpo_step.json (or --json).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

H100_BF16_DENSE = 989e12


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gib(dev: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None


def free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:
        return None


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import Qwen2ForCausalLM

    from sandgym.models.tiny import qwen2_config, tiny_qwen2

    torch.manual_seed(0)
    if args.small:
        return tiny_qwen2(vocab_size=args.vocab, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
    cfg = qwen2_config("0.5b", args.vocab, eos_token_id=args.vocab - 1, pad_token_id=args.vocab - 2)
    return Qwen2ForCausalLM(cfg)


# ---- batches ----------------------------------------------------------------------------


def make_rollouts(kind: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Token-level rollouts: prompt ids, then alternating (ids, trained?) completion segments,
    and a group-normalised advantage from random rewards."""
    from sandgym.core.stats import group_advantages

    rng = random.Random(0 if kind == "uniform" else 1)
    hi = min(args.vocab, 32000)
    tok = lambda n: [rng.randrange(hi) for _ in range(n)]  # noqa: E731
    out: list[dict[str, Any]] = []
    for _ in range(args.prompts):
        prompt = tok(args.prompt_len)
        rewards = [rng.random() for _ in range(args.group)]
        advs = group_advantages(rewards, normalize_std=True)
        for g in range(args.group):
            if kind == "uniform":
                segs = [(tok(args.completion_len), True)]
            else:
                total = rng.randint(args.completion_len // 16, args.completion_len)
                turns = rng.randint(1, 3)
                tool = [rng.randint(args.completion_len // 32, args.completion_len // 8) for _ in range(turns - 1)]
                model_total = max(turns, total - sum(tool))
                cuts = sorted(rng.sample(range(1, model_total), turns - 1)) if turns > 1 else []
                lens = [b - a for a, b in zip([0, *cuts], [*cuts, model_total])]
                segs = []
                for i, n in enumerate(lens):
                    segs.append((tok(n), True))
                    if i < len(tool):
                        segs.append((tok(tool[i]), False))
            out.append({"prompt": prompt, "segments": segs, "advantage": advs[g], "reward": rewards[g]})
    return out


def to_sequences(rollouts: list[dict[str, Any]]) -> list[Any]:
    """sandgym's path: multi-turn States (turn i's prompt = turn i-1's prompt + completion +
    tool tokens, as token-in produces) -> training sequences."""
    from sandgym.core.state import State, Turn, TurnTokens
    from sandgym.train.batch import states_to_sequences

    states = []
    for i, r in enumerate(rollouts):
        turns, ctx, pending = [], list(r["prompt"]), []
        for ids, trained in r["segments"]:
            if not trained:
                pending = ids
                continue
            prompt = ctx + pending
            turns.append(Turn(prompt=[], completion={}, tokens=TurnTokens(prompt_ids=prompt, completion_ids=ids)))
            ctx = prompt + ids
            pending = []
        states.append(State(example_id=i, rollout_index=0, turns=turns, reward=r["reward"], advantage=r["advantage"]))
    return states_to_sequences(states)


def to_trl_batch(rollouts: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """TRL's path: prompt ids, completions right-padded to the longest, completion_mask
    (real tokens) and tool_mask (0 on tool tokens), as GRPOTrainer builds them."""
    comps = [[t for ids, _ in r["segments"] for t in ids] for r in rollouts]
    tools = [[int(tr) for ids, tr in r["segments"] for _ in ids] for r in rollouts]
    width = max(len(c) for c in comps)
    ids = torch.full((len(comps), width), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(comps), width), dtype=torch.long)
    tmask = torch.ones((len(comps), width), dtype=torch.long)
    for i, (c, t) in enumerate(zip(comps, tools)):
        ids[i, : len(c)] = torch.tensor(c)
        cmask[i, : len(c)] = 1
        tmask[i, : len(t)] = torch.tensor(t)
    batch = {
        "prompt_ids": torch.tensor([r["prompt"] for r in rollouts], dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": cmask,
        "advantages": torch.tensor([r["advantage"] for r in rollouts], dtype=torch.float32),
    }
    if not bool(tmask.all()):
        batch["tool_mask"] = tmask
    return batch


def batch_stats(seqs: list[Any]) -> dict[str, Any]:
    lens = [len(s) for s in seqs]
    return {
        "sequences": len(seqs),
        "tokens": sum(lens),
        "trained_tokens": sum(s.num_loss_tokens for s in seqs),
        "sum_len_sq": sum(n * n for n in lens),
        "max_len": max(lens),
    }


def model_flops(model: torch.nn.Module, st: dict[str, Any]) -> float:
    """6 N_body T_all + 6 V H T_loss + 6 L d_attn sum(s^2) (see the module docstring)."""
    cfg = model.config
    emb = model.get_input_embeddings().weight
    vh = emb.numel()
    tied = model.get_output_embeddings().weight is emb
    n_body = sum(p.numel() for p in model.parameters()) - vh * (1 if tied else 2)
    d_attn = cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    return 6 * n_body * st["tokens"] + 6 * vh * st["trained_tokens"] + 6 * cfg.num_hidden_layers * d_attn * st["sum_len_sq"]


# ---- sections -----------------------------------------------------------------------------


def bench_head(heads: list[str], args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    """Forward + backward of the LM head + logprob (+ entropy) alone: fp32 master weight and
    fp32 hidden states under bf16 autocast, as in the trainer."""
    from sandgym.train.logprobs import HEAD_KERNELS

    n, h, v = args.head_tokens, args.hidden, args.vocab
    g = torch.Generator(device="cpu").manual_seed(3)
    head = torch.nn.Linear(h, v, bias=False).to(dev)
    hid0 = (torch.randn(n, h, generator=g) * 1.5).to(dev)
    tgt = torch.randint(0, v, (n,), generator=g).to(dev)
    coef = torch.randn(n, generator=g).to(dev)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    out: dict[str, Any] = {"tokens": n, "hidden": h, "vocab": v}
    ref: tuple[torch.Tensor, ...] | None = None
    for name in heads:
        try:
            fn = HEAD_KERNELS[name]

            def run(fn: Any = fn) -> tuple[torch.Tensor, ...]:
                head.weight.grad = None
                hid = hid0.clone().requires_grad_()
                with amp:
                    lp, ent = fn(hid, head, tgt, args.chunk, 1.0)
                (lp.float() * coef).sum().backward()
                return lp.detach().float(), (ent.detach().float() if ent is not None else None), hid.grad.float(), head.weight.grad.float()

            for _ in range(2):
                run()
            reset_peak(dev)
            times = []
            for _ in range(args.head_reps):
                sync(dev)
                t0 = time.perf_counter()
                res = run()
                sync(dev)
                times.append(time.perf_counter() - t0)
            r: dict[str, Any] = {"ms_median": 1e3 * sorted(times)[len(times) // 2], "ms_all": [1e3 * t for t in times], "peak_gib": peak_gib(dev)}
            if ref is None:
                ref = res
            else:
                rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
                r["max_abs_logprob_diff"] = float((res[0] - ref[0]).abs().max())
                r["max_abs_entropy_diff"] = float((res[1] - ref[1]).abs().max()) if res[1] is not None else None
                r["grad_hidden_rel_err"] = rel(res[2], ref[2])
                r["grad_weight_rel_err"] = rel(res[3], ref[3])
            out[name] = r
            print(f"head {name}: {r}", flush=True)
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            print(f"head {name} FAILED: {out[name]['traceback']}", flush=True)
    return out


def bench_sandgym(
    init: torch.nn.Module, seqs: list[Any], head: str, args: argparse.Namespace, dev: torch.device,
    patch: Callable[[torch.nn.Module], None] | None = None, profile: bool = False, compile_layers: bool = False,
) -> dict[str, Any]:
    from sandgym.train.config import ModelConfig, OptimConfig
    from sandgym.train.loss import LossConfig
    from sandgym.train.policy import PolicyTrainer

    model = copy.deepcopy(init).to(dev)
    if patch is not None:
        patch(model)
    mc = ModelConfig(attention=args.attention, gradient_checkpointing=args.grad_ckpt, logprob_chunk_size=args.chunk, logprob_kernel=head, compile_layers=compile_layers)
    pt = PolicyTrainer(model, mc, OptimConfig(lr=1e-6, micro_batch_tokens=args.micro_tokens), LossConfig(normalization="token"), dev)
    times: list[float] = []
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
    med = sorted(timed)[len(timed) // 2]
    out: dict[str, Any] = {
        "attention_kernel": pt.kernel,
        "head_kernel": pt.head_kernel,
        "seconds_median": med,
        "seconds_all": times,
        "micro_batches": metrics.get("micro_batches"),
        "peak_gib": peak_gib(dev),
        "loss_last": metrics.get("loss"),
        "entropy_last": metrics.get("entropy"),
        "grad_norm_last": metrics.get("grad_norm"),
    }
    if profile:
        out["profile"] = profile_step(pt, seqs, dev)
    del pt, model
    free(dev)
    return out


# First match wins: attention before matmul (flash kernels' names contain "cutlass").
CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "varlen")),
    ("matmul (cuBLAS/CUTLASS)", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "splitk")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("triton (fused)", ("triton",)),
    ("reductions/softmax", ("reduce", "softmax", "logsumexp", "norm")),
    ("elementwise/copy/index", ("elementwise", "vectorized", "unrolled", "catarray", "index", "gather", "scatter", "copy", "fill", "cast")),
)


def _category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def profile_step(pt: Any, seqs: list[Any], dev: torch.device) -> dict[str, Any]:
    """One step under torch.profiler: top kernels by device time (CPU ops on a CPU run)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sync(dev)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        pt.step(seqs)
        sync(dev)
    wall = time.perf_counter() - t0
    rows = []
    for e in prof.key_averages():
        if dev.type == "cuda":
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = e.self_device_time_total
        else:
            us = e.self_cpu_time_total
        if us > 0:
            rows.append({"name": e.key, "calls": e.count, "ms": us / 1e3})
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows)
    cats: dict[str, float] = {}
    for r in rows:
        r["pct"] = 100 * r["ms"] / total if total else 0.0
        cats[_category(r["name"])] = cats.get(_category(r["name"]), 0.0) + r["ms"]
    return {
        "what": "CUDA kernels, self device time" if dev.type == "cuda" else "CPU ops, self CPU time",
        "step_wall_s_under_profiler": wall,
        "kernel_ms_total": total,
        "top": rows[:15],
        "categories": sorted(({"category": k, "ms": v, "pct": 100 * v / total if total else 0.0} for k, v in cats.items()), key=lambda c: -c["ms"]),
    }


def bench_trl(init: torch.nn.Module, batch: dict[str, torch.Tensor], n_loss: int, args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    try:
        import trl
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except Exception as exc:
        return {"skipped": f"TRL not importable: {type(exc).__name__}: {exc}"}
    from sandgym.models.tiny import byte_tokenizer

    n = batch["prompt_ids"].shape[0]
    per_dev = args.trl_batch
    accum = n // per_dev
    steps = args.warmup + args.repeats

    class FixedBatchGRPO(GRPOTrainer):
        """GRPOTrainer whose generation returns our batch, so only the training step is compared."""

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:  # type: ignore[override]
            d = self.accelerator.device
            out = {k: v.to(d) for k, v in batch.items()}
            out["prompt_mask"] = torch.ones_like(out["prompt_ids"])
            out["num_items_in_batch"] = torch.tensor(float(n_loss), device=d)
            return out

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

    model = copy.deepcopy(init).to(dev)
    tok = byte_tokenizer()
    ds = Dataset.from_dict({"prompt": [f"prompt {i}" for i in range(n // args.group * steps)]})
    conf = dict(
        output_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "trl_bench"),
        per_device_train_batch_size=per_dev,
        gradient_accumulation_steps=accum,
        num_generations=args.group,
        max_completion_length=int(batch["completion_ids"].shape[1]),
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
        disable_tqdm=True,
    )
    try:
        cfg = GRPOConfig(**conf)
        trainer = FixedBatchGRPO(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Timer()])
        trainer.train()
        logs = [h for h in trainer.state.log_history if "entropy" in h]
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:], "version": trl.__version__}
    finally:
        del model
        free(dev)
    timed = times[args.warmup :]
    med = sorted(timed)[len(timed) // 2]
    res = {
        "version": trl.__version__,
        "seconds_median": med,
        "seconds_all": times,
        "padded_tokens": int(batch["prompt_ids"].numel() + batch["completion_ids"].numel()),
        "per_device_train_batch_size": per_dev,
        "gradient_accumulation_steps": accum,
        "peak_gib": peak[-1] if peak else None,
        "entropy_last": logs[-1].get("entropy") if logs else None,
    }
    del trainer
    free(dev)
    return res


def liger_layers(model: torch.nn.Module) -> None:
    """liger-kernel's RMSNorm, SwiGLU and RoPE in a Qwen2 model (its LM head untouched)."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen2

    apply_liger_kernel_to_qwen2(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False, model=model)


def fastest_head(sec: dict[str, Any], kind: str, heads: list[str]) -> str:
    timed = {h: sec.get(f"{kind}/sandgym[{h}]", {}).get("seconds_median") for h in heads}
    timed = {h: t for h, t in timed.items() if t}
    return min(timed, key=timed.get) if timed else "torch"


# ---- main ----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="tiny model, small batch (CPU smoke run)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--completion-len", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=896, help="hidden size for the LM head section")
    ap.add_argument("--micro-tokens", type=int, default=20480, help="sandgym packing budget per micro-batch (TRL here: 32 x 640)")
    ap.add_argument("--trl-batch", type=int, default=32, help="TRL per-device batch (sequences)")
    ap.add_argument("--chunk", type=int, default=4096, help="logprob chunk (positions) for sandgym's PyTorch head")
    ap.add_argument("--head-tokens", type=int, default=16384)
    ap.add_argument("--head-reps", type=int, default=5)
    ap.add_argument("--heads", default="torch,trl,liger", help="LM head kernels to run (sandgym.train.logprobs.HEAD_KERNELS)")
    ap.add_argument("--batches", default="uniform,variable")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of sections to skip: head,trl,profile")
    ap.add_argument("--liger-layers", action="store_true", help="also: best head + liger RMSNorm/SwiGLU/RoPE (uniform batch, last)")
    ap.add_argument("--compile-layers", action="store_true", help="also: fastest head + torch.compile'd decoder layers, each batch")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting sections past this many seconds")
    ap.add_argument("--hard-s", type=int, default=0, help="raise in the running section after this many seconds, then print what was measured")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t_start = time.perf_counter()
    if args.hard_s:

        def over(signum: int, frame: Any) -> None:
            raise TimeoutError(f"--hard-s {args.hard_s} reached")

        signal.signal(signal.SIGALRM, over)
        signal.alarm(args.hard_s)
    if args.small:
        args.prompts, args.group, args.prompt_len, args.completion_len, args.vocab, args.hidden = 4, 4, 16, 64, 264, 64
        args.micro_tokens, args.trl_batch, args.chunk, args.head_tokens, args.head_reps = 160, 4, 64, 64, 2
    skip = set(filter(None, args.skip.split(",")))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from sandgym.train.logprobs import available_head_kernels

    avail = available_head_kernels(dev)
    heads = [h for h in args.heads.split(",") if h]
    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "versions": {m: version(m) for m in ("torch", "transformers", "trl", "liger_kernel", "triton", "datasets", "accelerate")},
        "head_kernels_available": avail,
        "args": vars(args),
    }
    for mod in ("trl.kernels.chunked_logprob", "liger_kernel.ops.fused_linear_cross_entropy"):
        try:
            __import__(mod)
        except Exception as exc:  # why a fused kernel is unavailable
            info[f"import_error {mod}"] = f"{type(exc).__name__}: {exc}"
    print(f"info: {info}", flush=True)
    init = make_model(args)
    info["params_m"] = sum(p.numel() for p in init.parameters()) / 1e6
    pad_id = int(init.config.pad_token_id if init.config.pad_token_id is not None else 0)
    out: dict[str, Any] = {"info": info, "sections": {}}
    sec = out["sections"]
    path = args.json or (os.path.join(os.environ["OUT"], "grpo_step.json") if os.environ.get("OUT") else None)

    def save() -> None:  # after every section: a run killed at its time limit keeps what it measured
        if path:
            Path(path).write_text(json.dumps(out, indent=2, default=str))

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    def guarded(name: str, need_s: float, fn: Callable[[], Any]) -> None:
        if args.hard_s and time.perf_counter() - t_start >= args.hard_s:
            sec[name] = {"skipped": f"--hard-s {args.hard_s} reached"}
            return
        if left() < need_s:
            sec[name] = {"skipped": f"time budget: {left():.0f} s left, section needs ~{need_s:.0f} s"}
            print(f"{name}: {sec[name]['skipped']}", flush=True)
            return
        t0 = time.perf_counter()
        try:
            sec[name] = fn()
        except Exception as exc:
            sec[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        if isinstance(sec[name], dict):
            sec[name]["section_s"] = time.perf_counter() - t0
        shown = {k: v for k, v in sec[name].items() if k not in ("profile", "traceback")} if isinstance(sec[name], dict) else sec[name]
        print(f"{name} ({time.perf_counter() - t0:.1f} s, {left():.0f} s of budget left): {shown}", flush=True)
        if isinstance(sec[name], dict) and "traceback" in sec[name]:
            print(sec[name]["traceback"], flush=True)
        free(dev)
        save()

    runnable = [h for h in heads if h in avail]
    for h in heads:
        if h not in avail:
            sec[f"unavailable_{h}"] = {"skipped": f"{h} not available on {dev} (available: {avail})"}
    if "head" not in skip:
        guarded("head", 30, lambda: bench_head(runnable, args, dev))

    stats: dict[str, dict[str, Any]] = {}
    for kind in [b for b in args.batches.split(",") if b]:
        rollouts = make_rollouts(kind, args)
        seqs = to_sequences(rollouts)
        stats[kind] = batch_stats(seqs) | {"flops": model_flops(init, batch_stats(seqs))}
        print(f"batch {kind}: {stats[kind]}", flush=True)
        for h in runnable:
            prof = h == "torch" and kind == "uniform" and "profile" not in skip
            guarded(f"{kind}/sandgym[{h}]", 25, lambda h=h, prof=prof, seqs=seqs: bench_sandgym(init, seqs, h, args, dev, profile=prof))
        if args.compile_layers:
            best = fastest_head(sec, kind, runnable)
            guarded(f"{kind}/sandgym[{best}+compiled layers]", 60, lambda best=best, seqs=seqs: bench_sandgym(init, seqs, best, args, dev, compile_layers=True))
        if "trl" not in skip:
            batch = to_trl_batch(rollouts, pad_id)
            guarded(f"{kind}/trl", 30, lambda batch=batch, kind=kind: bench_trl(init, batch, stats[kind]["trained_tokens"], args, dev))
    out["batches"] = stats

    if args.liger_layers and "uniform" in stats:  # last: liger patches transformers' Qwen2 module for the process
        best = fastest_head(sec, "uniform", runnable)
        seqs = to_sequences(make_rollouts("uniform", args))
        guarded(f"uniform/sandgym[{best}+liger layers]", 25, lambda: bench_sandgym(init, seqs, best, args, dev, patch=liger_layers))

    # Ratios and MFU, all from this run.
    for name, r in sec.items():
        if not isinstance(r, dict) or "seconds_median" not in r:
            continue
        kind = name.split("/")[0]
        r["mfu"] = stats[kind]["flops"] / r["seconds_median"] / H100_BF16_DENSE
        trl_t = sec.get(f"{kind}/trl", {}).get("seconds_median")
        if trl_t and "/sandgym" in name:
            r["time_over_trl"] = r["seconds_median"] / trl_t
    save()
    print_tables(out)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


def print_tables(out: dict[str, Any]) -> None:
    info, sec = out["info"], out["sections"]
    v = info["versions"]
    print("\n== GRPO step benchmark ==")
    print(f"device {info['device']}  params {info['params_m']:.0f}M  " + "  ".join(f"{k} {x}" for k, x in v.items() if x))
    for kind, st in out.get("batches", {}).items():
        print(f"batch {kind}: {st['sequences']} seqs, {st['tokens']} tokens ({st['trained_tokens']} trained), max len {st['max_len']}, {st['flops'] / 1e12:.0f} TFLOP")
    prof = next((r["profile"] for r in sec.values() if isinstance(r, dict) and "profile" in r), None)
    if prof:
        print(f"\nprofile, one sandgym step [torch head], {prof['what']}: {prof['kernel_ms_total']:.0f} ms in kernels, step {prof['step_wall_s_under_profiler']:.2f} s under the profiler")
        for c in prof["categories"]:
            print(f"  {c['category']:<26} {c['ms']:8.1f} ms {c['pct']:5.1f}%")
        for r in prof["top"][:12]:
            print(f"  {r['ms']:8.1f} ms {r['pct']:5.1f}% x{r['calls']:<5} {r['name'][:90]}")
    head = sec.get("head")
    if isinstance(head, dict) and "tokens" in head:
        print(f"\nLM head + logprob (+entropy), fwd+bwd, {head['tokens']} tokens x {head['hidden']} x {head['vocab']}:")
        for k, r in head.items():
            if isinstance(r, dict) and "ms_median" in r:
                agree = "" if "max_abs_logprob_diff" not in r else (
                    f"  vs torch: |dlp| {r['max_abs_logprob_diff']:.2e}, |dent| {r['max_abs_entropy_diff'] if r['max_abs_entropy_diff'] is None else format(r['max_abs_entropy_diff'], '.2e')}, "
                    f"grad_h {r['grad_hidden_rel_err']:.1e}, grad_w {r['grad_weight_rel_err']:.1e}"
                )
                print(f"  {k:<6} {r['ms_median']:8.1f} ms  peak {r['peak_gib']}{agree}")
            elif isinstance(r, dict) and "error" in r:
                print(f"  {k:<6} ERROR {r['error'][:150]}")
    print("\n| batch / trainer | step s (median) | runs | MFU | time / TRL | peak GiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in sec.items():
        if not isinstance(r, dict) or name in ("head",):
            continue
        if "seconds_median" in r:
            ratio = f"{r['time_over_trl']:.2f}" if "time_over_trl" in r else ""
            pk = f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else ""
            runs = ", ".join(f"{t:.2f}" for t in r["seconds_all"])
            print(f"| {name} | {r['seconds_median']:.2f} | {runs} | {100 * r['mfu']:.1f}% | {ratio} | {pk} |")
        else:
            print(f"| {name} | {(r.get('skipped') or r.get('error') or '')[:120]} | | | | |")


if __name__ == "__main__":
    main()
