"""Rollout state: the trajectory of one episode, with the tokens the server returned.

This is the contract between environments (which fill it) and the trainer (which reads
`turns[*].tokens` and `advantage`). Add fields freely; do not rename or remove these.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, Field

Message = dict[str, Any]  # OpenAI chat message: {"role", "content", "tool_calls"?, ...}


class TurnTokens(BaseModel):
    """Token ids exactly as the inference server returned them (never re-tokenized)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float] = Field(default_factory=list)
    # Which weights sampled the completion (the trainer's optimizer steps), when the server
    # says (sandgym's training backends do; others leave it None).
    policy_version: int | None = None


class Turn(BaseModel):
    """One model call: what was sent, what came back, and what the environment answered."""

    prompt: list[Message]
    completion: Message
    env_response: list[Message] = Field(default_factory=list)
    tokens: TurnTokens | None = None
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    model_s: float = 0.0
    tools_s: float = 0.0
    # Where `tokens` came from: "return_token_ids" (vLLM >= 0.10 ids on the response),
    # "logprobs" (completion ids from `token_id:N` logprob entries; no prompt ids), or None.
    token_source: str | None = None
    # The prompt went to the server as token ids: the previous turn's prompt + completion ids
    # and the new messages' ids (core/tokens.py), so it extends them by construction.
    # False: the server rendered `prompt` (messages) itself.
    token_in: bool = False


class Timing(BaseModel):
    setup_s: float = 0.0  # sandbox acquire + environment setup
    model_s: float = 0.0
    tools_s: float = 0.0
    scoring_s: float = 0.0
    total_s: float = 0.0


class State(BaseModel):
    """One rollout. Errors mark the rollout (`error`), never the run."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    env: str = ""
    example_id: int = 0
    rollout_index: int = 0
    prompt: list[Message] = Field(default_factory=list)
    # The tool schemas offered to the model (rendered into its prompt by the chat template):
    # with `prompt` and `turns`, what rebuilds the token sequence from text (`sandgym sft`).
    tools: list[dict[str, Any]] | None = None
    answer: Any = None
    info: dict[str, Any] = Field(default_factory=dict)
    turns: list[Turn] = Field(default_factory=list)
    completion: list[Message] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    advantage: float | None = None
    stop_reason: str | None = None
    error: str | None = None
    # Why `error` happened (core/failures.py): "sandbox", "model", "environment", "timeout"
    # or "scoring". A rollout with an error is infrastructure's failure, not the policy's.
    error_kind: str | None = None
    timing: Timing = Field(default_factory=Timing)
    usage: dict[str, int] = Field(default_factory=dict)
    started_at: float = Field(default_factory=time.time)
    task: str | None = None  # the sub-environment a row belongs to (EnvGroup routing)
    sandbox_id: str | None = None
    # Free-form per-rollout scratch space for environments (not serialized to records).
    scratch: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @property
    def failed(self) -> bool:
        """True when infrastructure (sandbox, model server, environment code, time limit,
        reward function) failed the rollout: its reward is not a judgement of the policy."""
        return self.error is not None

    def fail(self, message: str, kind: str) -> None:
        """Mark the rollout failed, keeping the first failure's message and kind."""
        if self.error is None:
            self.error, self.error_kind = message, kind

    @property
    def has_tokens(self) -> bool:
        return bool(self.turns) and all(t.tokens is not None for t in self.turns)
