"""Issue 9 on the lent H100, in one process: the trainer's vLLM backend
(sandgym.train.backends.vllm.VLLMBackend, colocated) generates a GRPO batch and answers one
request on its OpenAI-compatible front, sleeps for a trainer step, wakes, takes the updated
weights in place (update_weights), and its logprobs of fixed completions are checked against
the trainer's; sleep/wake memory is measured; then vLLM vs the built-in transformers backend,
and packed varlen attention vs padded SDPA for training.

Run on the device after scripts/device/vllm_join.sh has unpacked vllm into /tmp/vsite:
    PYTHONPATH=/tmp/vsite:. PYTHONUNBUFFERED=1 python3 benchmarks/vllm_device.py --out $OUT
(/tmp/vsite also supplies pydantic, which sandgym.train needs; without it the script stops at
once unless --skip-vllm.) Each section is guarded: a failure is logged with its traceback and
the others still run; the exit status is 1 when any section failed. The short table is printed
last; the full log and a JSON of every number go to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# vLLM's own settings (in-process engine core, no flashinfer sampler) are set by
# sandgym.train.backends.vllm (ENGINE_ENV), which this script runs; they are recorded in the JSON.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Nothing outside the device can be reached: never let a library try.
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
    os.environ.setdefault(_k, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

GiB = 2**30
DEV = "cuda"  # "cpu" with --cpu-smoke (a quick check of the non-vLLM sections here)
R: dict[str, Any] = {"errors": {}}
LOG: list[str] = []

# Declared before measuring: the post-update engine logprobs must match the trainer's
# recomputation within these (bf16 weights in both; different kernels and fusion).
TOL_MAX_ABS = 0.25
TOL_MEAN_ABS = 0.02


def log(*a: Any) -> None:
    s = " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    log(f"\n=== {name} ===")
    t0 = time.perf_counter()
    try:
        yield
    except BaseException as e:  # keep going: every other section still reports
        if isinstance(e, KeyboardInterrupt):
            raise
        tb = traceback.format_exc()
        R["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
        log(f"!!! {name} failed: {type(e).__name__}: {e}\n{tb}")
    finally:
        log(f"--- {name}: {time.perf_counter() - t0:.1f}s")


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def free_gib() -> float:
    sync()
    return torch.cuda.mem_get_info()[0] / GiB if DEV == "cuda" else 0.0


def reset_peak() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(base: int = 0) -> float:
    return (torch.cuda.max_memory_allocated() - base) / GiB if DEV == "cuda" else 0.0


def allocated() -> int:
    return torch.cuda.memory_allocated() if DEV == "cuda" else 0


def median_time(fn: Callable[[], Any], warmup: int = 2, reps: int = 5) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        if DEV != "cuda":
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        sync()
        ts.append(a.elapsed_time(b) / 1000)
    return statistics.median(ts), ts


# ---------------------------------------------------------------------------------------------


def env_info() -> None:
    import transformers

    R["torch"] = torch.__version__
    R["torch_file"] = torch.__file__
    R["transformers"] = transformers.__version__
    R["device_name"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    R["gpu_total_gib"] = round(torch.cuda.mem_get_info()[1] / GiB, 1) if DEV == "cuda" else 0
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401

        R["torch_varlen_attn"] = True
    except Exception as e:
        R["torch_varlen_attn"] = f"missing: {e}"
    try:
        import flash_attn

        R["flash_attn"] = getattr(flash_attn, "__version__", "yes")
    except Exception as e:
        R["flash_attn"] = f"not importable: {type(e).__name__}: {e}"
    log(json.dumps({k: R[k] for k in ("torch", "torch_file", "transformers", "device_name", "gpu_total_gib", "torch_varlen_attn", "flash_attn")}, indent=1))


def build_model(a: argparse.Namespace) -> tuple[Path, Any]:
    from transformers import AutoTokenizer

    from sandgym.models import tiny

    out = Path(a.model_dir)
    t0 = time.perf_counter()
    tiny.build(out, size=a.size, vocab_size=a.vocab, seed=0, dtype="bfloat16", device=DEV)
    meta = json.loads((out / "sandgym_model.json").read_text())
    R["model"] = meta | {"build_s": round(time.perf_counter() - t0, 1)}
    log("model:", R["model"])
    tok = AutoTokenizer.from_pretrained(out)
    reset_peak()
    return out, tok


def make_prompts(tok: Any, n: int, length: int) -> list[list[int]]:
    """n windows of `length` tokens of the project's own text (deterministic)."""
    from sandgym.models.tiny import corpus_files

    text = "".join(f.read_text(errors="replace") for f in corpus_files())
    ids = tok.encode(text, add_special_tokens=False)
    step = max(1, (len(ids) - length) // n)
    return [ids[i * step : i * step + length] for i in range(n)]


# ---------------------------------------------------------------------------------------------


def require_train_backend() -> Any:
    """The trainer's vLLM backend module. The vLLM section exists to run that code, so an
    import failure here stops the script (no fallback to raw vLLM calls)."""
    try:
        from sandgym.train import policy  # noqa: F401  (pydantic: from /tmp/vsite on the device)
        from sandgym.train.backends import vllm as vb
    except Exception as e:
        msg = (
            f"FATAL: sandgym.train cannot be imported ({type(e).__name__}: {e}); the vLLM section "
            "runs the trainer's VLLMBackend. On the device run with PYTHONPATH=/tmp/vsite:. "
            "(the carried tree has pydantic), or pass --skip-vllm."
        )
        log(msg)
        raise SystemExit(msg) from e
    return vb


def start_backend(vb: Any, model_dir: Path, tok: Any, a: argparse.Namespace) -> Any:
    """The trainer's backend (VLLMBackend): vllm.LLM in this process + its HTTP front."""
    t0 = time.perf_counter()
    import vllm

    R["vllm"] = vllm.__version__
    R["vllm_import_s"] = round(time.perf_counter() - t0, 1)
    log(f"vllm {vllm.__version__} imported in {R['vllm_import_s']}s; torch still {torch.__version__}")
    backend = vb.VLLMBackend(
        str(model_dir),
        tok,
        gpu_memory_utilization=a.gpu_mem,
        max_model_len=a.prompt_len + a.max_tokens + 16,
        sleep_during_training=True,
        max_batch_size=a.prompts * a.group,
        max_num_seqs=a.max_num_seqs,  # the whole GRPO batch in flight at once (vLLM default 256)
        enforce_eager=a.eager,
        seed=0,
    )
    R["vllm_engine_kwargs"] = backend.engine_kwargs()
    R["vllm_env"] = {k: os.environ.get(k) for k in vb.ENGINE_ENV}
    free0 = free_gib()
    t0 = time.perf_counter()
    # No eager retry in this process: a second LLM fails ("CuMem allocator can only be used
    # for one instance per process"); rerun with --eager instead.
    backend.start()
    R["vllm_mode"] = "eager" if a.eager else "compiled+cudagraphs"
    R["vllm_init_s"] = round(time.perf_counter() - t0, 1)
    R["vllm_engine_gib"] = round(free0 - free_gib(), 2)
    try:
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

        R["vllm_fa_version"] = get_flash_attn_version()
    except Exception as e:
        R["vllm_fa_version"] = f"? {e}"
    log(f"VLLMBackend up in {R['vllm_init_s']}s ({R['vllm_mode']}), engine holds {R['vllm_engine_gib']} GiB, "
        f"FA version {R['vllm_fa_version']}, HTTP front {backend.base_url}")
    return backend


def backend_generate(backend: Any, prompts: list[list[int]], a: argparse.Namespace, n: int) -> tuple[list[dict[str, Any]], float]:
    """The GRPO batch through VLLMEngine.generate (what the HTTP front calls): n requests per
    prompt, token ids and sampled-token logprobs back."""
    from sandgym.train.backends.base import GenRequest

    reqs = [GenRequest(prompt_ids=p, max_tokens=a.max_tokens, temperature=1.0, top_p=1.0, ignore_eos=True) for p in prompts for _ in range(n)]
    sync()
    t0 = time.perf_counter()
    res = backend.engine.generate(reqs)
    sync()
    dt = time.perf_counter() - t0
    rows = []
    for i, (q, r) in enumerate(zip(reqs, res)):
        if len(r.logprobs) != len(r.completion_ids):
            raise AssertionError(f"request {i}: {len(r.completion_ids)} tokens but {len(r.logprobs)} logprobs")
        rows.append({"prompt_index": i // n, "prompt": list(q.prompt_ids), "completion": r.completion_ids, "logprobs": r.logprobs})
    return rows, dt


def http_check(backend: Any, prompt: list[int], a: argparse.Namespace) -> dict[str, Any]:
    """One /v1/completions request through the backend's OpenAI-compatible front (the path the
    trainer's environments take: the front's batching thread calls VLLMEngine.generate)."""
    import urllib.request

    n, mt = 4, 16
    body = {"model": backend.model_name, "prompt": prompt, "n": n, "max_tokens": mt, "temperature": 1.0,
            "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    req = urllib.request.Request(backend.base_url + "/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        out = json.loads(resp.read())
    dt = time.perf_counter() - t0
    ch = out["choices"]
    lens = [len(c["token_ids"]) for c in ch]
    lps = [x for c in ch for x in c["logprobs"]["token_logprobs"]]
    ok = len(ch) == n and lens == [mt] * n and len(lps) == n * mt and all(math.isfinite(x) and x <= 0 for x in lps)
    if not ok:
        raise AssertionError(f"unexpected HTTP answer: {len(ch)} choices, lengths {lens}, {len(lps)} logprobs")
    return {"choices": n, "tokens_each": mt, "seconds": round(dt, 3), "ok": ok}


# ---------------------------------------------------------------------------------------------


def trainer_recompute(model: torch.nn.Module, seqs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """The trainer's logprobs of the same completions (packed varlen path, bf16 autocast, as in
    training)."""
    from sandgym.train.attention import pick_kernel, use_varlen
    from sandgym.train.logprobs import packed_logprobs

    use_varlen(model)
    kernel = pick_kernel(DEV, "auto")
    out = []
    model.eval()
    with torch.no_grad(), torch.autocast(DEV, dtype=torch.bfloat16):
        for p, c in seqs:
            full = p + c
            ids = torch.tensor([full], device=DEV)
            pos = torch.arange(len(full), device=DEV)[None]
            cu = torch.tensor([0, len(full)], dtype=torch.int32, device=DEV)
            tgt = torch.tensor(full[1:] + [0], device=DEV)
            lp, _ = packed_logprobs(model, ids, pos, cu, len(full), tgt, kernel=kernel)
            out.append(lp[len(p) - 1 : len(full) - 1].float().cpu().tolist())
    model.train()
    return out


def toy_reward(completion: list[int], vocab: int) -> float:
    # Learnable token-level reward: share of tokens in the lower half of the vocabulary.
    return sum(1 for t in completion if t < vocab // 2) / max(1, len(completion))


def truncate_lengths(n: int, max_tokens: int, seed: int = 0) -> list[int]:
    # Generation ran with ignore_eos (equal lengths, a fair tokens/s comparison); the training
    # batch cuts completions at random lengths, as EOS would, so packing has work to do.
    rng = random.Random(seed)
    return [rng.randint(max(8, max_tokens // 16), max_tokens) for _ in range(n)]


def trainer_step(model: torch.nn.Module, rows: list[dict[str, Any]], a: argparse.Namespace, vocab: int) -> dict[str, Any]:
    from sandgym.core.stats import group_advantages
    from sandgym.train.batch import Sequence
    from sandgym.train.config import ModelConfig, OptimConfig
    from sandgym.train.loss import LossConfig
    from sandgym.train.policy import PolicyTrainer

    rewards = [toy_reward(r["completion"], vocab) for r in rows]
    by_prompt: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_prompt.setdefault(r["prompt_index"], []).append(i)
    adv = [0.0] * len(rows)
    for idx in by_prompt.values():
        for i, x in zip(idx, group_advantages([rewards[i] for i in idx])):
            adv[i] = x
    seqs = [
        Sequence(
            input_ids=r["prompt"] + r["completion"],
            loss_mask=[0] * len(r["prompt"]) + [1] * len(r["completion"]),
            inference_logprobs=[0.0] * len(r["prompt"]) + r["logprobs"],
            advantage=float(adv[i]),
            reward=rewards[i],
        )
        for i, r in enumerate(rows)
    ]
    pt = PolicyTrainer(
        model,
        ModelConfig(name_or_path="offline", dtype="auto", attention="auto"),
        OptimConfig(lr=a.lr, micro_batch_tokens=a.micro_batch_tokens, warmup_steps=0, grad_clip=1.0),
        LossConfig(),
        torch.device(DEV),
    )
    reset_peak()
    m = pt.step(seqs)
    m["kernel"] = pt.kernel
    m["peak_alloc_gib"] = round(peak_gib(), 2)
    m["reward_mean"] = sum(rewards) / len(rewards)
    del pt
    return m


# ---------------------------------------------------------------------------------------------


def varlen_vs_padded(model: torch.nn.Module, seqs: list[tuple[list[int], list[int], float]], reps: int) -> dict[str, Any]:
    """Forward+backward of the same GRPO-style loss on the same sequences: packed into one row
    (varlen kernels) vs right-padded to the longest (SDPA with a padding mask)."""
    from sandgym.train.attention import available_kernels, packed_forward_kwargs, use_varlen
    from sandgym.train.logprobs import chunked_logprobs

    use_varlen(model)  # routes calls with cu_seq_lens to varlen, the padded call to HF's SDPA
    model.train()
    base = model.get_decoder()
    head = model.get_output_embeddings()
    dev = DEV
    n = len(seqs)
    lens = [len(p) + len(c) for p, c, _ in seqs]
    tot, lmax = sum(lens), max(lens)
    # Shared targets/mask/advantages, flattened over real tokens in sequence order.
    tgt, msk, advs = [], [], []
    for p, c, adv in seqs:
        full = p + c
        tgt += full[1:] + [0]
        msk += [0.0] * (len(p) - 1) + [1.0] * len(c) + [0.0]
        advs += [adv] * len(full)
    tgt_t = torch.tensor(tgt, device=dev)
    msk_t = torch.tensor(msk, device=dev)
    adv_t = torch.tensor(advs, device=dev)
    ntok = msk_t.sum()

    def loss_from_hidden(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, _ = chunked_logprobs(h, head, tgt_t, 4096)
        # Policy-gradient loss -A * logprob, token mean: the same gradient as GRPO's clipped
        # surrogate on its first pass (ratio 1), and unlike that surrogate its value depends on
        # the logprobs, so comparing it between the two paths means something.
        return -(adv_t * lp * msk_t).sum() / ntok, lp

    ids_packed = torch.tensor([[t for p, c, _ in seqs for t in p + c]], device=dev)
    pos_packed = torch.tensor([[i for L in lens for i in range(L)]], device=dev)
    cu = torch.tensor([0] + list(_cumsum(lens)), dtype=torch.int32, device=dev)

    def packed(kernel: str) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        def run() -> tuple[torch.Tensor, torch.Tensor]:
            model.zero_grad(set_to_none=True)
            with torch.autocast(dev, dtype=torch.bfloat16):
                h = base(input_ids=ids_packed, position_ids=pos_packed, use_cache=False, **packed_forward_kwargs(cu, lmax, kernel)).last_hidden_state[0]
                loss, lp = loss_from_hidden(h)
            loss.backward()
            return loss.detach(), lp.detach()

        return run

    ids_pad = torch.zeros((n, lmax), dtype=torch.long, device=dev)
    att = torch.zeros((n, lmax), dtype=torch.long, device=dev)
    for i, (p, c, _) in enumerate(seqs):
        ids_pad[i, : lens[i]] = torch.tensor(p + c, device=dev)
        att[i, : lens[i]] = 1
    pos_pad = torch.arange(lmax, device=dev)[None].expand(n, -1)
    real = att.bool()

    def padded() -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16):
            h = base(input_ids=ids_pad, attention_mask=att, position_ids=pos_pad, use_cache=False).last_hidden_state
            loss, lp = loss_from_hidden(h[real])  # row-major: same order as the packed row
        loss.backward()
        return loss.detach(), lp.detach()

    variants: dict[str, Callable[[], Any]] = {"padded_sdpa": padded}
    for k in available_kernels(dev):
        variants[f"packed_{k}"] = packed(k)
    out: dict[str, Any] = {"sequences": n, "real_tokens": tot, "padded_tokens": n * lmax, "max_len": lmax}
    ref_loss = ref_lp = None
    for name, fn in variants.items():
        try:
            reset_peak()
            sync()
            base_alloc = allocated()
            loss, lp = fn()
            sync()
            peak = peak_gib(base_alloc)
            med, ts = median_time(fn, warmup=1, reps=reps)
            row = {"fwd_bwd_s": round(med, 4), "times": [round(t, 4) for t in ts], "peak_extra_gib": round(peak, 2), "loss": float(loss)}
            if ref_loss is None:
                ref_loss, ref_lp = loss, lp
            else:
                row["loss_rel_diff_vs_padded"] = float((loss - ref_loss).abs() / ref_loss.abs().clamp_min(1e-12))
                row["logprob_max_abs_diff_vs_padded"] = float((lp - ref_lp).abs().max())
            out[name] = row
            log(f"{name}: {row}")
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"[:1000]}
            log(f"!!! {name}: {traceback.format_exc()}")
    model.zero_grad(set_to_none=True)
    return out


def _cumsum(xs: list[int]) -> Iterator[int]:
    s = 0
    for x in xs:
        s += x
        yield s


# ---------------------------------------------------------------------------------------------


CPU_SMOKE = dict(
    model_dir="/tmp/sandgym-qwen2-smoke", size="tiny", vocab=400, prompts=2, group=2, prompt_len=12,
    max_tokens=16, check_seqs=2, attn_seqs=4, reps=1, micro_batch_tokens=64,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--model-dir", default="/tmp/sandgym-qwen2")
    ap.add_argument("--size", default="0.5b")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--gpu-mem", type=float, default=0.3)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--check-seqs", type=int, default=16)
    ap.add_argument("--attn-seqs", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU, no vLLM: checks the other sections here")
    if "--cpu-smoke" in sys.argv[1:]:  # small defaults (flags given still win): minutes, not hours, on CPU
        ap.set_defaults(**CPU_SMOKE)
    a = ap.parse_args()
    if a.cpu_smoke:
        global DEV
        DEV = "cpu"
        a.skip_vllm = True
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    R["args"] = vars(a)
    R["date_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    torch.manual_seed(0)
    vb: Any = None
    if not a.skip_vllm:  # first, so a bad PYTHONPATH costs seconds of device time, not minutes
        try:
            vb = require_train_backend()  # exits loudly: the vLLM section must run the trainer's code
        except SystemExit as e:
            R["errors"]["import sandgym.train"] = str(e)
            _finish(out)
            raise

    with section("environment"):
        env_info()
    tok = model_dir = None
    with section("build offline model"):
        model_dir, tok = build_model(a)
    if model_dir is None:
        _finish(out)
        return
    prompts = make_prompts(tok, a.prompts, a.prompt_len)
    vocab = int(R["model"]["model_vocab"])

    backend = None  # the trainer's VLLMBackend (sandgym/train/backends/vllm.py)
    rows: list[dict[str, Any]] = []
    if not a.skip_vllm:
        with section("vllm engine (VLLMBackend.start)"):
            backend = start_backend(vb, model_dir, tok, a)
        if backend is not None:
            with section("vllm generation (VLLMEngine.generate)"):
                backend_generate(backend, prompts[:4], a, 2)  # warm-up (sampler, graphs for small batches)
                rows, dt = backend_generate(backend, prompts, a, a.group)
                ntok = sum(len(r["completion"]) for r in rows)
                R["vllm_gen"] = {"seconds": round(dt, 2), "tokens": ntok, "tokens_per_s": round(ntok / dt, 1), "sequences": len(rows)}
                log("vllm generation:", R["vllm_gen"])
            with section("vllm HTTP front (/v1/completions)"):
                R["vllm_http"] = http_check(backend, prompts[0], a)
                log("vllm http:", R["vllm_http"])

    # The training batch: completions cut at random lengths (as EOS would).
    if rows:
        cut = truncate_lengths(len(rows), a.max_tokens)
        for r, L in zip(rows, cut):
            r["completion"], r["logprobs"] = r["completion"][:L], r["logprobs"][:L]
    else:  # no engine: a batch of random completions so the training sections still run
        g = torch.Generator().manual_seed(0)
        cut = truncate_lengths(a.prompts * a.group, a.max_tokens)
        for i, L in enumerate(cut):
            rows.append({"prompt_index": i // a.group, "prompt": prompts[i // a.group], "completion": torch.randint(3, vocab, (L,), generator=g).tolist(), "logprobs": [0.0] * L})
    check = [(r["prompt"], r["completion"]) for r in rows[: a.check_seqs]]
    pre_engine = [r["logprobs"] for r in rows[: a.check_seqs]] if backend is not None else None

    from transformers import AutoModelForCausalLM

    model = None
    with section("trainer model"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEV)  # fp32 master weights
        log("trainer model loaded (float32 master weights, bf16 autocast)")

    if backend is not None:
        with section("sleep (VLLMBackend.sleep)"):
            torch.cuda.empty_cache()
            f0 = free_gib()
            t0 = time.perf_counter()
            backend.sleep()
            t_sleep = time.perf_counter() - t0
            f1 = free_gib()
            R["sleep"] = {"free_before_gib": round(f0, 2), "free_asleep_gib": round(f1, 2), "freed_gib": round(f1 - f0, 2), "sleep_s": round(t_sleep, 2), "asleep": backend.asleep}
            log("sleep:", R["sleep"])

    if model is not None:
        with section("trainer step"):
            try:
                R["train_step"] = trainer_step(model, rows, a, vocab)
                R["train_step"]["backend"] = "sandgym.train.policy.PolicyTrainer"
            except ImportError as e:
                if backend is not None:
                    raise  # with vLLM on, sandgym.train was imported above: this is a real failure
                log(f"sandgym.train not importable ({e}); plain AdamW step instead")
                R["train_step"] = _plain_step(model, rows, a) | {"backend": f"plain torch AdamW (sandgym.train import failed: {e})"}
            log("train step:", R["train_step"])

    if backend is not None:
        with section("wake + in-place weight load (VLLMBackend.wake, update_weights)"):
            torch.cuda.empty_cache()
            f2 = free_gib()
            t0 = time.perf_counter()
            backend.wake()
            t_wake = time.perf_counter() - t0
            f3 = free_gib()
            R["wake"] = {"free_before_wake_gib": round(f2, 2), "free_awake_gib": round(f3, 2), "restored_gib": round(f2 - f3, 2), "wake_s": round(t_wake, 2), "asleep": backend.asleep}
            log("wake:", R["wake"])
            if model is not None:
                backend.update_weights(model)
                R["weight_update"] = dict(backend.last_update)
                R["weight_load_s"] = round(backend.last_update["seconds"], 3)
                log(f"weights loaded into the engine: {R['weight_update']}")

        if model is not None and "weight_update" in R:
            with section("logprob agreement after update (VLLMEngine.logprobs_of)"):
                eng = backend.engine.logprobs_of(check)
                trn = trainer_recompute(model, check)
                diffs = [abs(x - y) for e, t in zip(eng, trn) for x, y in zip(e, t)]
                shift = [abs(x - y) for e, t in zip(pre_engine or [], trn) for x, y in zip(e, t)]
                R["logprob_check"] = {
                    "sequences": len(check),
                    "tokens": len(diffs),
                    "max_abs_diff": max(diffs),
                    "mean_abs_diff": sum(diffs) / len(diffs),
                    "tolerance": {"max_abs": TOL_MAX_ABS, "mean_abs": TOL_MEAN_ABS},
                    "pass": max(diffs) <= TOL_MAX_ABS and sum(diffs) / len(diffs) <= TOL_MEAN_ABS,
                    # How far the step moved them: engine before the update vs trainer after.
                    "update_shift_mean_abs": (sum(shift) / len(shift)) if shift else None,
                    "update_shift_max_abs": max(shift) if shift else None,
                }
                log("logprob check:", R["logprob_check"])
                if not R["logprob_check"]["pass"]:
                    raise AssertionError(f"engine vs trainer logprobs outside tolerance: {R['logprob_check']}")

        with section("vllm generation after update"):
            _, dt = backend_generate(backend, prompts, a, a.group)
            ntok = a.prompts * a.group * a.max_tokens
            R["vllm_gen_after_update"] = {"seconds": round(dt, 2), "tokens_per_s": round(ntok / dt, 1)}
            log("vllm generation after update:", R["vllm_gen_after_update"])
        with section("release engine (VLLMBackend.close)"):
            f4 = free_gib()
            backend.close()
            backend = None
            R["close"] = {"freed_gib": round(free_gib() - f4, 2)}
            log("close:", R["close"])

    if model is not None:
        with section("transformers backend generation"):
            R["hf_gen"] = _hf_generate(model, tok, prompts, a)
            log("hf generation:", R["hf_gen"])

        with section("varlen vs padded attention (training)"):
            rng = random.Random(1)
            pick = rows[: a.attn_seqs]
            seqs = [(r["prompt"], r["completion"], rng.uniform(-1, 1)) for r in pick]
            R["attention"] = varlen_vs_padded(model, seqs, a.reps)

    _finish(out)


def _plain_step(model: torch.nn.Module, rows: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    t0 = time.perf_counter()
    ntok = 0
    for r in rows:
        full = torch.tensor([r["prompt"] + r["completion"]], device=DEV)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            logits = model(full).logits[0, len(r["prompt"]) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, full[0, len(r["prompt"]) :, None]).squeeze(-1)
        (-lp.mean() / len(rows)).backward()
        ntok += full.shape[1]
    opt.step()
    sync()
    return {"train_s": time.perf_counter() - t0, "train_tokens": ntok}


def _hf_generate(model: torch.nn.Module, tok: Any, prompts: list[list[int]], a: argparse.Namespace) -> dict[str, Any]:
    reqs_n = a.prompts * a.group
    try:
        from sandgym.train.backends.base import GenRequest
        from sandgym.train.backends.hf import HFEngine

        eng = HFEngine(model, tok, device=DEV, autocast_dtype=torch.bfloat16, max_batch_size=reqs_n)
        reqs = [GenRequest(prompt_ids=p, max_tokens=a.max_tokens, temperature=1.0, ignore_eos=True) for p in prompts for _ in range(a.group)]
        eng.generate([GenRequest(prompt_ids=prompts[0], max_tokens=8, ignore_eos=True)])  # warm-up
        sync()
        t0 = time.perf_counter()
        res = eng.generate(reqs)
        sync()
        dt = time.perf_counter() - t0
        ntok = sum(len(r.completion_ids) for r in res)
        backend = "sandgym.train.backends.hf.HFEngine (bf16 autocast, fp32 weights, one batch)"
    except ImportError as e:
        ids = torch.tensor([p for p in prompts for _ in range(a.group)], device=DEV)
        with torch.no_grad(), torch.autocast(DEV, dtype=torch.bfloat16):
            sync()
            t0 = time.perf_counter()
            o = model.generate(ids, do_sample=True, max_new_tokens=a.max_tokens, min_new_tokens=a.max_tokens)
            sync()
            dt = time.perf_counter() - t0
        ntok = (o.shape[1] - ids.shape[1]) * o.shape[0]
        backend = f"transformers generate (HFEngine import failed: {e})"
    out = {"backend": backend, "seconds": round(dt, 2), "tokens": ntok, "tokens_per_s": round(ntok / dt, 1)}
    if "vllm_gen" in R:
        out["vllm_over_hf"] = round(R["vllm_gen"]["tokens_per_s"] / out["tokens_per_s"], 2)
    return out


def _finish(out: Path) -> None:
    (out / "vllm_device.json").write_text(json.dumps(R, indent=1, default=str))
    rows: list[tuple[str, str]] = []

    def add(k: str, v: Any) -> None:
        rows.append((k, str(v)))

    add("device", R.get("device_name"))
    add("torch / vllm", f"{R.get('torch')} / {R.get('vllm', 'not loaded')}")
    if "model" in R:
        add("model params", f"{R['model']['params'] / 1e6:.0f}M (vocab {R['model']['model_vocab']})")
    if "vllm_gen" in R:
        g = R["vllm_gen"]
        add("vLLM gen tok/s", f"{g['tokens_per_s']} ({g['tokens']} tok, {g['seconds']}s, {R.get('vllm_mode')})")
    if "hf_gen" in R:
        g = R["hf_gen"]
        add("HF backend gen tok/s", f"{g['tokens_per_s']} ({g['tokens']} tok, {g['seconds']}s)")
        add("vLLM / HF", g.get("vllm_over_hf"))
    if "sleep" in R:
        add("backend.sleep() frees", f"{R['sleep']['freed_gib']} GiB in {R['sleep']['sleep_s']}s")
    if "wake" in R:
        add("backend.wake() re-takes", f"{R['wake']['restored_gib']} GiB in {R['wake']['wake_s']}s")
    if "vllm_http" in R:
        h = R["vllm_http"]
        add("VLLMBackend HTTP front", f"/v1/completions n={h['choices']} x {h['tokens_each']} tok in {h['seconds']}s, ok={h['ok']}")
    if "weight_update" in R:
        u = R["weight_update"]
        add("update_weights (in place)", f"{R['weight_load_s']}s, {u['engine_params_loaded']} engine params from {u['trainer_tensors']} trainer tensors, prefix cache reset={u['prefix_cache_reset']}")
    if "close" in R:
        add("close() frees", f"{R['close']['freed_gib']} GiB")
    if "train_step" in R:
        t = R["train_step"]
        add("trainer step", f"{t.get('train_s', 0):.2f}s, {t.get('train_tokens_per_s', 0):.0f} tok/s, kernel {t.get('kernel')}")
    if "logprob_check" in R:
        c = R["logprob_check"]
        add("logprob max|diff| (tol)", f"{c['max_abs_diff']:.4f} ({TOL_MAX_ABS}) mean {c['mean_abs_diff']:.5f} ({TOL_MEAN_ABS}) pass={c['pass']}")
        add("update moved logprobs", f"mean {c['update_shift_mean_abs']}, max {c['update_shift_max_abs']}")
    att = R.get("attention", {})
    for k, v in att.items():
        if isinstance(v, dict):
            if "error" in v:
                add(f"attn {k}", v["error"][:100])
            else:
                extra = f", loss rel diff {v['loss_rel_diff_vs_padded']:.2e}" if "loss_rel_diff_vs_padded" in v else ""
                add(f"attn {k}", f"fwd+bwd {v['fwd_bwd_s'] * 1000:.1f} ms, peak +{v['peak_extra_gib']} GiB{extra}")
    if att:
        add("attn batch", f"{att.get('sequences')} seqs, {att.get('real_tokens')} real / {att.get('padded_tokens')} padded tokens")
    for k, v in R["errors"].items():
        add(f"ERROR {k}", v[:160])
    w = max(len(k) for k, _ in rows)
    table = "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)
    (out / "vllm_device.log").write_text("\n".join(LOG) + "\n\n" + table + "\n")
    print("\n" + table, flush=True)


if __name__ == "__main__":
    main()
    sys.exit(1 if R["errors"] else 0)
