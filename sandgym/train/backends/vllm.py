"""vLLM inference backend, colocated with the trainer on one GPU.

The engine (`vllm.LLM`, in this process, sleep mode on) sits behind the same OpenAI-compatible
server as the transformers backend (`hf.build_app`), so environments reach it exactly as they
reach any model server. After each optimizer step `update_weights` loads the trainer's
tensors into the engine's model in place (`LLM.apply_model` -> `model.load_weights`) and
resets the prefix cache; `sleep` / `wake` free and restore the engine's GPU memory around
training.

Status: written against vLLM's documented Python API (0.10+: `LLM.apply_model`,
`LLM.sleep`, `LLM.wake_up`, `LLM.reset_prefix_cache`, `TokensPrompt`); it has not run in
this repository yet (no vllm on the CPU machine; the device has none installed). Issue 9
carries vllm to the device and checks it. A separate `vllm serve` process is not supported
yet: pushing weights to it needs its dev-mode RPC endpoints, which we have not exercised.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

import torch

from sandgym.train.backends.hf import GenRequest, GenResult

# In-process engine core, so apply_model runs our callable on the engine's model in this
# process (no pickling of closures over CUDA tensors).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class VLLMEngine:
    """Same interface as HFEngine (generate / tokenizer / max_batch_size / lock)."""

    def __init__(self, llm: Any, tokenizer: Any, max_batch_size: int = 1024) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.lock = threading.Lock()
        eos = tokenizer.eos_token_id if tokenizer is not None else None
        self.eos_ids = [int(eos)] if eos is not None else []

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        from vllm import SamplingParams, TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in reqs]
        params = [
            SamplingParams(
                max_tokens=r.max_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                stop_token_ids=list(r.stop_token_ids) or None,
                ignore_eos=r.ignore_eos,
                logprobs=0,  # the sampled token's logprob (raw, before temperature)
            )
            for r in reqs
        ]
        with self.lock:
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids)]
            results.append(GenResult(completion_ids=ids, logprobs=lps, finish_reason="length" if c.finish_reason == "length" else "stop"))
        return results


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
    ) -> None:
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.sleep_during_training = sleep_during_training
        self.max_batch_size = max_batch_size
        self.llm: Any = None
        self.asleep = False
        self.weights_version = 0
        self._http: Any = None  # the OpenAI-compatible front (an HFBackend-style server)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def from_config(cls, cfg: Any, model: torch.nn.Module, tokenizer: Any) -> "VLLMBackend":
        if cfg.backend.base_url:
            raise NotImplementedError("a separate `vllm serve` is not supported yet; use the colocated engine")
        path = cfg.model.name_or_path
        b = cls(
            path,
            tokenizer,
            gpu_memory_utilization=cfg.backend.gpu_memory_utilization,
            max_model_len=cfg.backend.max_model_len,
            sleep_during_training=cfg.backend.sleep_during_training,
            max_batch_size=cfg.backend.max_batch_size,
        )
        if path == "tiny":  # vLLM loads from disk: write the trainer's initial weights
            b._tmp = tempfile.TemporaryDirectory(prefix="sandgym-vllm-")
            model.save_pretrained(b._tmp.name)
            tokenizer.save_pretrained(b._tmp.name)
            b.model_path = b._tmp.name
        return b

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def start(self) -> None:
        from vllm import LLM

        from sandgym.train.backends.hf import HFBackend

        self.llm = LLM(
            model=self.model_path,
            dtype="bfloat16",
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            enable_sleep_mode=True,
            enable_prefix_caching=True,
        )
        engine = VLLMEngine(self.llm, self.tokenizer, self.max_batch_size)
        # The transformers backend's HTTP front, with the vLLM engine behind it.
        self._http = HFBackend.for_engine(engine, self.model_name)
        self._http.start()

    def update_weights(self, model: torch.nn.Module) -> None:
        sd = model.state_dict()

        def load(m: torch.nn.Module) -> None:
            m.load_weights(((k, v) for k, v in sd.items()))

        self.wake()
        with self._http.engine.lock:
            self.llm.apply_model(load)
            self.llm.reset_prefix_cache()
        self.weights_version += 1

    def sleep(self) -> None:
        if self.llm is not None and self.sleep_during_training and not self.asleep:
            # Level 1 offloads weights to CPU and drops the KV cache; the weights are
            # overwritten by update_weights anyway.
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.llm is not None and self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        self.llm = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


__all__ = ["VLLMBackend", "VLLMEngine", "vllm_available"]
