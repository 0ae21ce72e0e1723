"""EnvGroup: several environments behind one dataset; each row carries `task` (the name of
its environment) and is rolled out and scored by that environment."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .clients import ModelClient
from .environment import Environment
from .rubric import Rubric
from .state import Message, State

if TYPE_CHECKING:
    from sandgym.sandboxes.manager import SandboxManager
    from sandgym.sandboxes.spec import SandboxSpec


class EnvGroup(Environment):
    def __init__(self, envs: Sequence[Environment], names: Sequence[str] | None = None, **kwargs: Any) -> None:
        if not envs:
            raise ValueError("EnvGroup needs at least one environment")
        names = list(names) if names is not None else [e.name for e in envs]
        if len(set(names)) != len(names):
            raise ValueError(f"environment names must be unique, got {names}")
        self.envs: dict[str, Environment] = dict(zip(names, envs, strict=True))
        train, evals = [], []
        for name, env in self.envs.items():
            if env.dataset is not None:
                train.extend(self._tagged(env, name, "train"))
            evals.extend(self._tagged(env, name, "eval"))
        kwargs.setdefault("name", "+".join(names))
        super().__init__(dataset=train or None, eval_dataset=evals or None, rubric=kwargs.pop("rubric", None) or Rubric(), **kwargs)

    @staticmethod
    def _tagged(env: Environment, name: str, split: str) -> list[dict[str, Any]]:
        rows = []
        for row in env.rows(None, split=split):
            rows.append(
                {
                    "prompt": json.dumps(env.format_prompt(row)),
                    "answer": json.dumps(row.get("answer")),
                    # Per-env info schemas differ; JSON keeps one Arrow column type.
                    "info": json.dumps(row.get("info") or {}),
                    "task": name,
                    "source_example_id": row["example_id"],
                }
            )
        return rows

    def rows(self, n: int | None = None, *, split: str = "eval") -> list[dict[str, Any]]:
        out = super().rows(n, split=split)
        for row in out:
            if isinstance(row.get("prompt"), str):
                row["prompt"] = json.loads(row["prompt"])
            if isinstance(row.get("answer"), str):
                row["answer"] = json.loads(row["answer"])
        return out

    def env_for(self, task: str | None) -> Environment:
        if task not in self.envs:
            raise KeyError(f"row task {task!r} is not one of {list(self.envs)}")
        return self.envs[task]

    def sandbox_specs(self) -> list[SandboxSpec]:
        return [s for e in self.envs.values() for s in e.sandbox_specs()]

    def bind_sandboxes(self, manager: SandboxManager | None) -> None:
        self.sandboxes = manager
        for e in self.envs.values():
            e.bind_sandboxes(manager)

    async def rollout(
        self,
        client: ModelClient,
        model: str,
        row: Mapping[str, Any],
        rollout_index: int = 0,
        sampling_args: Mapping[str, Any] | None = None,
        *,
        score: bool = True,
    ) -> State:
        env = self.env_for(row.get("task"))
        sub_row = dict(row)
        state = await env.rollout(client, model, sub_row, rollout_index, sampling_args, score=score)
        state.task = row.get("task")
        state.env = self.name
        state.example_id = int(row["example_id"])
        state.info.setdefault("source_example_id", row.get("source_example_id"))
        return state

    async def score_group(self, states: Sequence[State]) -> None:
        if states:
            await self.env_for(states[0].task).score_group(states)

    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        return await self.env_for(state.task).oracle_response(messages, state)

    async def close(self) -> None:
        for e in self.envs.values():
            await e.close()
        await super().close()
