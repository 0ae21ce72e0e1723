"""The inference seams of training: the engine and the inference backend.

Generation always goes through an OpenAI-compatible HTTP endpoint (`base_url`), the same way
environments reach any model server (clients in the server's own process call its app
directly: uvicorn_thread.offer_in_process). An `InferenceEngine` turns token ids into sampled token
ids and their logprobs; `openai_server.OpenAIServer` puts any engine behind that endpoint. An
`InferenceBackend` (hf.HFBackend, vllm.VLLMBackend) owns an engine and its server, and
receives new weights after each optimizer step.

This module imports nothing beyond torch: the device image runs the engines without the
HTTP stack.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class GenResult:
    completion_ids: list[int]
    logprobs: list[float]  # the sampled tokens' raw (temperature 1) logprobs
    finish_reason: str  # "stop" | "length"
    # The weights that produced it: the number of optimizer steps applied to them (the
    # server returns it as `policy_version` on each choice; None where unknown).
    policy_version: int | None = None


# How a queued request is answered: its result, or the error that ended it.
Done = Callable[[GenResult | BaseException], None]
# How an engine that batches continuously takes queued requests (RequestBatcher.take):
# (wait for the first?, at most how many) -> (requests with their Done, whether the queue closed).
Take = Callable[[bool, int], tuple[list[tuple[GenRequest, Done]], bool]]


# What update_weights takes: the trainer's module, or a full (unsharded) state dict, e.g. the
# one rank 0 gathers from an FSDP2-sharded model.
Weights = torch.nn.Module | Mapping[str, torch.Tensor]


def state_of(weights: Weights) -> Mapping[str, torch.Tensor]:
    """The tensors of `weights` by name (a module's state dict, tied tensors under each name)."""
    return weights.state_dict() if isinstance(weights, torch.nn.Module) else weights


@runtime_checkable
class InferenceEngine(Protocol):
    """Token ids in, token ids and logprobs out (hf.HFEngine, vllm.VLLMEngine)."""

    tokenizer: Any  # a transformers tokenizer: the server renders chats and decodes text with it
    max_batch_size: int  # the most requests the server hands to one `generate` call

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """One result per request, in order (thread-safe: the server calls it from a worker)."""
        ...


@runtime_checkable
class InferenceBackend(Protocol):
    """What the trainer drives: start, generation through `base_url`, a weight push after
    each optimizer step, sleep around training, close.

    Weight updates and in-flight generation: the engine generates one batch of requests at a
    time under its lock; `update_weights` takes that lock, so it waits for the batch being
    decoded, swaps the weights, and the requests queued meanwhile run on the new ones. A
    multi-turn rollout is never stopped: its later turns may come from newer weights, and
    every response says which (`GenResult.policy_version`)."""

    name: str  # "hf" or "vllm"
    model_name: str  # what clients pass as `model`
    weights_version: int  # the policy version being served (optimizer steps applied)

    @property
    def base_url(self) -> str:  # e.g. http://127.0.0.1:PORT/v1
        ...

    @property
    def can_update_in_flight(self) -> bool:
        """Whether weights can be pushed while generation goes on (asynchronous training):
        false where the engine serves the trainer's own tensors, or sleeps during training."""
        ...

    def start(self) -> None: ...

    def update_weights(self, weights: Weights, version: int | None = None) -> None:
        """Make the served model equal to `weights` (the trainer's module or a full state
        dict), now policy version `version` (default: the previous one + 1)."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory for training (no-op where not supported)."""
        ...

    def wake(self) -> None: ...

    def close(self) -> None: ...
