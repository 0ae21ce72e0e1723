"""vLLM inference backend, colocated with the trainer on one GPU.

The engine (`vllm.LLM`, in this process, sleep mode on) sits behind its own instance of the
OpenAI-compatible server the transformers backend uses (`openai_server.OpenAIServer`), so
environments reach it exactly as they reach any model server. After each optimizer step `update_weights` loads the trainer's
tensors into the engine's model in place (`LLM.apply_model` -> the model's `load_weights`,
which maps Hugging Face names onto vLLM's fused q/k/v and gate/up tensors) and resets the
prefix cache; `sleep` / `wake` free and restore the engine's GPU memory around training.

Every vLLM call here is one that benchmarks/vllm_device.py ran on the lent H100 with vllm
0.26.0 (benchmarks/RESULTS.md, issue 9): the in-process engine core
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), `VLLM_USE_FLASHINFER_SAMPLER=0`, `LLM(dtype="bfloat16",
enable_sleep_mode=True, gpu_memory_utilization, max_model_len, seed, max_num_seqs,
enforce_eager)`, `generate` on `vllm.inputs.TokensPrompt` with `SamplingParams(logprobs=0,
detokenize=False)`, `prompt_logprobs=0` for scoring, `apply_model` + `load_weights`,
`reset_prefix_cache`, `sleep(level=1)` / `wake_up()`. Not covered by that run: a separate
`vllm serve` process (pushing weights to it needs its dev-mode RPC endpoints), and vLLM loading
the built-in byte tokenizer of `name_or_path = "tiny"`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from sandgym.train.backends.base import GenRequest, GenResult, Weights
from sandgym.train.backends.openai_server import OpenAIServer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

# Set before vLLM reads them (it reads its environment lazily, at engine construction).
ENGINE_ENV = {
    # In-process engine core: apply_model runs our callable on the engine's model in this
    # process, so the trainer's CUDA tensors are handed over without pickling.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # flashinfer is not carried to the device; without this vLLM's sampler probe imports it
    # unguarded and engine start fails (plain temperature/top-p sampling needs none of it).
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}


def engine_env() -> None:
    for k, v in ENGINE_ENV.items():
        os.environ.setdefault(k, v)


engine_env()


def vllm_import_error() -> str | None:
    """Why `import vllm` fails here, or None when it works."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything else
        return f"{type(e).__name__}: {e}"
    return None


def vllm_available() -> bool:
    return vllm_import_error() is None


def require_vllm() -> None:
    err = vllm_import_error()
    if err is not None:
        raise RuntimeError(
            f"backend.kind = 'vllm' but vllm cannot be imported ({err}); "
            "install vllm (see scripts/device/README.md for the device) or use backend.kind = 'hf'"
        )


# ---- weights ---------------------------------------------------------------------------------


def engine_weights(model: Weights, to_cpu: bool = False) -> list[tuple[str, torch.Tensor]]:
    """The trainer's parameters as (Hugging Face name, tensor) for the engine's `load_weights`.

    From a module, `named_parameters` lists a tied tensor once (no `lm_head.weight` when
    embeddings are tied; vLLM's model shares it too). From a full state dict (an FSDP2 rank 0
    gather) every name is passed; vLLM's loaders skip `lm_head.*` of tied models. The tensors
    are the trainer's own (detached, no copy) unless `to_cpu` (what goes to tensor-parallel
    workers in other processes): the engine's loader copies them into its buffers with the
    dtype cast (float32 -> bf16)."""
    items = model.named_parameters() if isinstance(model, torch.nn.Module) else model.items()
    return [(n, p.detach().cpu() if to_cpu else p.detach()) for n, p in items]


def load_into(engine_model: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside the engine (through `LLM.apply_model`): loads `weights` into its model in
    place and checks that every engine parameter received a value, as vLLM's own loader checks
    at start-up. Returns how many engine parameters were loaded."""
    m = engine_model.unwrap() if hasattr(engine_model, "unwrap") else engine_model  # CUDA-graph wrapper
    loaded = m.load_weights(iter(weights))
    if loaded is None:  # a model whose load_weights reports nothing: cannot be checked
        log.warning("engine model %s does not report loaded weights; update not verified", type(m).__name__)
        return -1
    missing = sorted({n for n, _ in m.named_parameters()} - set(loaded))
    if missing:
        raise RuntimeError(f"weight update left {len(missing)} engine parameters unset: {missing[:8]}")
    return len(loaded)


# ---- engine ----------------------------------------------------------------------------------


def sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The sampled tokens' logprobs from vLLM's per-position {token_id: Logprob} list."""
    if not logprobs:
        return []
    return [float(logprobs[t][tid].logprob) for t, tid in enumerate(token_ids)]


class VLLMEngine:
    """An InferenceEngine over `vllm.LLM`, plus `logprobs_of` (the engine's logprobs of fixed
    completions) and `lock` (held while generating, sleeping, waking, loading weights)."""

    def __init__(self, llm: Any, tokenizer: Any, max_batch_size: int = 1024) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size  # the server's batch size
        self.lock = threading.Lock()  # held while generating, sleeping, waking, loading weights
        self.policy_version = 0  # of the weights served; changed under `lock`

    @staticmethod
    def _params(r: GenRequest) -> Any:
        from vllm import SamplingParams

        # Token ids in, token ids + logprobs out: the HTTP front decodes text itself with the
        # tokenizer, so vLLM's detokenizer is skipped (with max_num_seqs 512: 1.7x the tokens/s
        # of vLLM's defaults on the device).
        return SamplingParams(
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop_token_ids=list(r.stop_token_ids) or None,
            ignore_eos=r.ignore_eos,
            logprobs=0,  # the sampled token's logprob (raw, before temperature)
            detokenize=False,
        )

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        from vllm.inputs import TokensPrompt

        if not reqs:
            return []
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in reqs]
        keys = {(r.max_tokens, r.temperature, r.top_p, tuple(r.stop_token_ids), r.ignore_eos) for r in reqs}
        # One SamplingParams for the whole batch when the requests agree (the usual GRPO case,
        # and the form run on the device); else one per request.
        params: Any = self._params(reqs[0]) if len(keys) == 1 else [self._params(r) for r in reqs]
        with self.lock:
            outs = self.llm.generate(prompts, params, use_tqdm=False)
            version = self.policy_version
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            results.append(
                GenResult(
                    completion_ids=ids,
                    logprobs=sampled_logprobs(ids, c.logprobs),
                    finish_reason="length" if c.finish_reason == "length" else "stop",
                    policy_version=version,
                )
            )
        return results

    def logprobs_of(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """The engine's logprobs of each fixed completion given its prompt (prompt logprobs of
        prompt + completion; one token is generated and ignored)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        with self.lock:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p) + list(c)) for p, c in pairs], sp, use_tqdm=False)
        res = []
        for (p, c), o in zip(pairs, outs, strict=True):
            full = list(p) + list(c)
            pl = o.prompt_logprobs
            res.append([float(pl[j][full[j]].logprob) for j in range(len(p), len(full))])
        return res


# ---- backend ---------------------------------------------------------------------------------


class VLLMBackend:
    name = "vllm"

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        model_name: str = "sandgym-policy",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int = 4096,
        sleep_during_training: bool = True,
        max_batch_size: int = 1024,
        max_num_seqs: int = 256,
        enforce_eager: bool = False,
        seed: int = 0,
        tensor_parallel_size: int = 1,
    ) -> None:
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.sleep_during_training = sleep_during_training
        self.max_batch_size = max_batch_size
        # Sequences in flight in the engine: a GRPO batch should fit at once (vLLM's default
        # 256 left half of a 512-sequence batch waiting on the device).
        self.max_num_seqs = max_num_seqs
        self.enforce_eager = enforce_eager
        self.seed = seed
        self.tensor_parallel_size = tensor_parallel_size
        self.llm: Any = None
        self.engine: VLLMEngine | None = None
        self.asleep = False
        self.weights_version = 0
        self.last_update: dict[str, Any] = {}
        self.server: OpenAIServer | None = None  # made with the engine, in start()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def from_config(cls, cfg: Any, model: PreTrainedModel, tokenizer: Any) -> VLLMBackend:
        require_vllm()  # before writing anything: say plainly what is missing
        path = cfg.model.name_or_path
        b = cls(
            path,
            tokenizer,
            gpu_memory_utilization=cfg.backend.gpu_memory_utilization,
            max_model_len=cfg.backend.max_model_len,
            sleep_during_training=cfg.vllm_sleeps(),
            max_batch_size=cfg.backend.max_batch_size,
            max_num_seqs=max(256, cfg.backend.max_batch_size, cfg.rollout.prompts_per_step * cfg.rollout.group_size),
            seed=cfg.optim.seed,
            tensor_parallel_size=cfg.backend.tensor_parallel_size,
        )
        if path == "tiny":  # vLLM loads from disk: write the trainer's initial weights
            b._tmp = tempfile.TemporaryDirectory(prefix="sandgym-vllm-")
            model.save_pretrained(b._tmp.name)
            tokenizer.save_pretrained(b._tmp.name)
            b.model_path = b._tmp.name
        return b

    @property
    def base_url(self) -> str:
        if self.server is None:
            raise RuntimeError("the vLLM backend is not started")
        return self.server.base_url

    @property
    def can_update_in_flight(self) -> bool:
        # Generation goes on during training only while the engine is awake; an update then
        # waits for the engine batch in progress (the engine lock), loads, and the next batch
        # runs on the new weights: vLLM's pause -> update -> resume at batch granularity.
        return not self.sleep_during_training

    def engine_kwargs(self) -> dict[str, Any]:
        """What `vllm.LLM` is constructed with (the arguments run on the device; the
        tensor-parallel size only when above 1, which has not been run there yet)."""
        kw: dict[str, Any] = dict(
            model=str(self.model_path),
            dtype="bfloat16",
            enable_sleep_mode=True,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            seed=self.seed,
            max_num_seqs=self.max_num_seqs,
            enforce_eager=self.enforce_eager,
        )
        if self.tensor_parallel_size > 1:
            kw["tensor_parallel_size"] = self.tensor_parallel_size
        return kw

    def start(self) -> None:
        require_vllm()
        engine_env()
        if self.tensor_parallel_size > 1:
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model to TP workers
        from vllm import LLM

        # No in-process retry on failure: a second LLM in the same process fails with "CuMem
        # allocator can only be used for one instance per process" (seen on the device).
        self.llm = LLM(**self.engine_kwargs())
        self.asleep = False
        self.engine = VLLMEngine(self.llm, self.tokenizer, self.max_batch_size)
        self.engine.policy_version = self.weights_version
        self.server = OpenAIServer(self.engine, self.model_name)
        self.server.start()

    def _lock(self) -> Any:
        return self.engine.lock if self.engine is not None else contextlib.nullcontext()

    def update_weights(self, weights: Weights, version: int | None = None) -> None:
        if self.llm is None:
            raise RuntimeError("the vLLM backend is not started")
        v = self.weights_version + 1 if version is None else int(version)
        # Tensor-parallel workers are other processes: `apply_model` pickles the function
        # and its tensors to each (VLLM_ALLOW_INSECURE_SERIALIZATION, set in start()), so the
        # tensors go as CPU copies; each worker's load_weights keeps its own shard. Not yet
        # run on a device (issue 14).
        named = engine_weights(weights, to_cpu=self.tensor_parallel_size > 1)
        self.wake()
        t0 = time.perf_counter()
        with self._lock(), torch.no_grad():
            res = self.llm.apply_model(lambda m: load_into(m, named))
            n = res[0] if isinstance(res, list) and res else res
            # Cached KV came from the old weights. Recorded as returned (True/False, or None
            # where this vLLM returns nothing); a failure is logged, the new weights stay loaded.
            reset: Any
            try:
                reset = self.llm.reset_prefix_cache()
            except Exception as e:
                reset = f"failed: {type(e).__name__}: {e}"
            if reset is False or isinstance(reset, str):
                log.warning("vLLM prefix cache not reset after a weight update (%s): stale KV may be served", reset)
            if self.engine is not None:
                self.engine.policy_version = v
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.weights_version = v
        self.last_update = {
            "engine_params_loaded": n,
            "trainer_tensors": len(named),
            "seconds": time.perf_counter() - t0,
            "prefix_cache_reset": reset,
            "version": self.weights_version,
        }

    def sleep(self) -> None:
        if self.llm is not None and self.sleep_during_training and not self.asleep:
            # Level 1 offloads weights to CPU and drops the KV cache; the weights are
            # overwritten by update_weights anyway.
            with self._lock():
                self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.llm is not None and self.asleep:
            with self._lock():
                self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.llm is not None:
            # Dropping the LLM object alone does not give its GPU memory back in-process;
            # sleeping first does (measured on the device before the transformers run).
            if not self.asleep:
                try:
                    with self._lock():
                        self.llm.sleep(level=1)
                except Exception as e:
                    log.warning("vLLM sleep on close failed: %s", e)
            self.llm = None
            self.engine = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> VLLMBackend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "ENGINE_ENV",
    "VLLMBackend",
    "VLLMEngine",
    "engine_env",
    "engine_weights",
    "load_into",
    "require_vllm",
    "sampled_logprobs",
    "vllm_available",
    "vllm_import_error",
]
