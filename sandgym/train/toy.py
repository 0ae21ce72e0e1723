"""ToyTask: a toy multi-turn task with a token-level reward a tiny random model learns in
minutes; a RolloutSource (rollout_source.py) for the trainer.

Each prompt is a short random byte string. The model answers (turn 1), the task appends
a few fixed tokens (standing in for a tool result), the model answers again (turn 2). Reward:
the fraction of generated tokens whose id lies in [target_low, target_high] (lowercase ASCII
by default, about 26/259 = 10% under a uniform random policy).

Generation uses `/v1/completions` with token-id prompts, so turn 2's prompt is by construction
turn 1's prompt + completion + environment tokens: the token contract the trainer checks.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from sandgym.core.failures import classify
from sandgym.core.state import State, Turn, TurnTokens
from sandgym.train.config import ToyTaskConfig


class ToyTask:
    name = "toy"

    def __init__(self, cfg: ToyTaskConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed

    def prompt_ids(self, index: int) -> list[int]:
        rng = random.Random(self.seed * 1_000_003 + index)
        # Prompts avoid the target range so the reward measures generation only.
        pool = [i for i in range(32, 127) if not (self.cfg.target_low <= i <= self.cfg.target_high)]
        return [rng.choice(pool) for _ in range(self.cfg.prompt_len)]

    def reward(self, completion_ids: list[int]) -> float:
        if not completion_ids:
            return 0.0
        hit = sum(self.cfg.target_low <= t <= self.cfg.target_high for t in completion_ids)
        return hit / len(completion_ids)

    async def rollout(self, client: Any, model: str, index: int, rollout_index: int, sampling: dict[str, Any]) -> State:
        prompt = self.prompt_ids(index)
        state = State(env=self.name, example_id=index, rollout_index=rollout_index, prompt=[{"role": "user", "content": str(prompt)}])
        ids = list(prompt)
        generated: list[int] = []
        try:
            for t in range(self.cfg.turns):
                resp = await client.completions.create(
                    model=model,
                    prompt=ids,
                    max_tokens=sampling["max_tokens"],
                    temperature=sampling.get("temperature", 1.0),
                    top_p=sampling.get("top_p", 1.0),
                    logprobs=1,
                    extra_body={"return_token_ids": True},
                )
                ch = resp.choices[0]
                extra = ch.model_extra or {}
                p_ids = list(extra.get("prompt_token_ids") or ids)
                c_ids = list(extra["token_ids"])
                lps = [float(x) for x in (ch.logprobs.token_logprobs if ch.logprobs else [])]
                env_tokens = list(self.cfg.env_tokens) if t + 1 < self.cfg.turns else []
                state.turns.append(
                    Turn(
                        prompt=[{"role": "user", "content": str(p_ids)}],
                        completion={"role": "assistant", "content": ch.text},
                        env_response=[{"role": "user", "content": str(env_tokens)}] if env_tokens else [],
                        tokens=TurnTokens(
                            prompt_ids=p_ids,
                            completion_ids=c_ids,
                            completion_logprobs=lps,
                            policy_version=extra.get("policy_version"),
                        ),
                        finish_reason=ch.finish_reason,
                    )
                )
                generated.extend(c_ids)
                ids = p_ids + c_ids + env_tokens
            state.reward = self.reward(generated)
            state.metrics["completion_tokens"] = float(len(generated))
            state.stop_reason = "max_turns"
        except Exception as exc:  # a failed rollout is marked, never the run
            import openai

            # The model server failed (after the client's retries) or answered unusably.
            model_failure = isinstance(exc, (openai.APIError, KeyError))
            state.fail(f"{type(exc).__name__}: {exc}", "model" if model_failure else classify(exc))
        return state

    @asynccontextmanager
    async def sandbox_session(self) -> AsyncIterator[None]:
        yield  # no sandboxes

    async def generate_groups(
        self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict[str, Any], max_concurrent: int
    ) -> list[list[State]]:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key="sandgym", max_retries=2, timeout=600)
        groups: list[list[State | None]] = [[None] * group_size for _ in range(count)]
        limiter = anyio.CapacityLimiter(max_concurrent)

        async def one(g: int, r: int) -> None:
            async with limiter:
                groups[g][r] = await self.rollout(client, model, start + g, r, sampling)

        try:
            async with anyio.create_task_group() as tg:
                for g in range(count):
                    for r in range(group_size):
                        tg.start_soon(one, g, r)
        finally:
            await client.close()
        return [[s for s in grp if s is not None] for grp in groups]
