"""Rubrics: weighted reward functions, metrics and group rewards, as in verifiers.

Reward functions are sync or async and receive only the arguments they name, from:
prompt, completion, answer, state, info, task, parser, example_id, rollout_index, plus
whatever the environment adds for scoring (e.g. `sandbox`, `sandboxes`). A function with
weight 0 is a metric: recorded, not rewarded. Group reward functions name plural arguments
(prompts, completions, answers, states, infos, tasks) and return one float per rollout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .calls import call_with_named
from .failures import classify, error_text
from .parsers import Parser, last_assistant_text
from .state import State
from .stats import group_advantages

log = logging.getLogger(__name__)

RewardFunc = Callable[..., Any]


class Rubric:
    def __init__(
        self,
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        *,
        normalize_advantages: bool = True,
    ) -> None:
        funcs = list(funcs or [])
        weights = list(weights) if weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"{len(funcs)} reward functions but {len(weights)} weights")
        self.funcs: list[tuple[RewardFunc, float]] = list(zip(funcs, weights, strict=True))
        self.group_funcs: list[tuple[RewardFunc, float]] = []
        self.parser = parser or Parser()
        self.normalize_advantages = normalize_advantages

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        self.funcs.append((func, weight))

    def add_metric(self, func: RewardFunc) -> None:
        self.funcs.append((func, 0.0))

    def add_group_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        self.group_funcs.append((func, weight))

    @staticmethod
    def name_of(func: RewardFunc) -> str:
        return getattr(func, "__name__", type(func).__name__)

    def available(self, state: State, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {
            "prompt": state.prompt,
            "completion": state.completion,
            "answer": state.answer,
            "state": state,
            "info": state.info,
            "task": state.task,
            "parser": self.parser,
            "example_id": state.example_id,
            "rollout_index": state.rollout_index,
        }
        if extra:
            args.update(extra)
        return args

    async def score_rollout(self, state: State, extra: Mapping[str, Any] | None = None) -> State:
        """Set `state.reward` (weighted sum) and `state.metrics` (every function's value).
        A reward function that raises scores 0, is named in `state.metrics` as an error, and
        marks the rollout (`state.error`): a crash while scoring (a sandbox lost mid-test, say)
        is not a legitimate 0 and must show in the run's error count."""
        t0 = time.perf_counter()
        args = self.available(state, extra)
        total = 0.0
        for func, weight in self.funcs:
            name = self.name_of(func)
            try:
                value = float(await call_with_named(func, args))
            except Exception as exc:
                log.warning("reward function %s failed: %r", name, exc)
                state.metrics[f"{name}_error"] = 1.0
                state.fail(f"scoring: {name} failed: {error_text(exc)}", classify(exc, default="scoring"))
                value = 0.0
            state.metrics[name] = value
            total += weight * value
        state.reward = total
        state.timing.scoring_s += time.perf_counter() - t0
        return state

    async def score_group(self, states: Sequence[State], extra: Mapping[str, Any] | None = None) -> list[State]:
        """Add group rewards to each state's reward, then set group-normalised advantages."""
        if self.group_funcs and states:
            args: dict[str, Any] = {
                "prompts": [s.prompt for s in states],
                "completions": [s.completion for s in states],
                "answers": [s.answer for s in states],
                "states": list(states),
                "infos": [s.info for s in states],
                "tasks": [s.task for s in states],
                "parser": self.parser,
            }
            if extra:
                args.update(extra)
            for func, weight in self.group_funcs:
                name = self.name_of(func)
                values = [float(v) for v in await call_with_named(func, args)]
                if len(values) != len(states):
                    raise ValueError(f"group reward {name} returned {len(values)} values for {len(states)} rollouts")
                for s, v in zip(states, values, strict=True):
                    s.metrics[name] = v
                    s.reward += weight * v
        for s, adv in zip(states, group_advantages([s.reward for s in states], normalize_std=self.normalize_advantages), strict=True):
            s.advantage = adv
        return list(states)


GRADER_PROMPT = """Given a ground-truth answer and a response, decide whether the response is correct.

Question:
```
{question}
```

Ground truth answer:
```
{answer}
```

Response:
```
{response}
```

Reply with "yes" or "no" only."""


class GraderRubric(Rubric):
    """Asks a grader model (any OpenAI-compatible endpoint, via a sandgym ModelClient) whether
    the response matches the answer. Reward 1 for a reply starting with "yes". (verifiers
    calls this JudgeRubric; here a judge is sandgym.judge, the programming judge.)"""

    def __init__(
        self,
        grader_client: Any,
        grader_model: str = "grader",
        grader_prompt: str = GRADER_PROMPT,
        parser: Parser | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        weight: float = 1.0,
    ) -> None:
        super().__init__(parser=parser)
        self.grader_client = grader_client
        self.grader_model = grader_model
        self.grader_prompt = grader_prompt
        self.sampling_args = dict(sampling_args or {"temperature": 0.0})
        self.add_reward_func(self.grader_reward, weight)

    async def grade(self, prompt: Any, completion: Any, answer: Any) -> str:
        question = last_user_text(prompt)
        response = self.parser.parse_answer(completion) or ""
        content = self.grader_prompt.format(question=question, answer=answer, response=response)
        reply = await self.grader_client.chat(
            [{"role": "user", "content": content}], model=self.grader_model, sampling_args=self.sampling_args
        )
        return last_assistant_text([reply.message])

    async def grader_reward(self, prompt: Any, completion: Any, answer: Any) -> float:
        verdict = (await self.grade(prompt, completion, answer)).strip().lower()
        return 1.0 if verdict.startswith("yes") else 0.0


def last_user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    for msg in reversed(list(prompt or [])):
        if msg.get("role") == "user":
            c = msg.get("content")
            return c if isinstance(c, str) else str(c)
    return ""
