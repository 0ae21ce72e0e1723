"""A deliberately imperfect policy for BFCL: the oracle, wrong on a fixed share of steps.

For checking that sandgym and `bfcl evaluate` agree on more than all-right and all-wrong
outputs. Which steps go wrong, and how, depends only on the entry id and the turn (a CRC),
so runs are reproducible. Kinds of mistakes: a parallel call left out, an argument value
changed (a wrong value, or a wrong type), a text answer instead of calls, and a call where
none is wanted (irrelevance).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from sandgym.core.clients import ModelResponse
from sandgym.core.state import Message, State
from sandgym.core.tools import tool_call


def _mutate(value: Any, kind: int) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if kind % 2 else str(value)  # a wrong value, or a wrong type
    if isinstance(value, str):
        return value + "_wrong" if kind % 2 else [value]
    if isinstance(value, list):
        return value[:-1] if value else ["wrong"]
    if isinstance(value, dict):
        return {**value, "unexpected": 1}
    return "wrong"


class ImperfectOracle:
    """Wraps an environment's oracle; one step in `every` (by CRC of id and turn) goes wrong."""

    name = "imperfect"

    def __init__(self, env: Any, every: int = 3) -> None:
        self.env = env
        self.every = every

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str = "imperfect",
        tools: Sequence[dict[str, Any]] | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        state: State | None = None,
    ) -> ModelResponse:
        if state is None:
            raise ValueError("the imperfect policy needs the rollout state")
        msg = await self.env.oracle_response(list(messages), state)
        turn = (state.scratch.get("bfcl") or {}).get("turn", 0)
        h = zlib.crc32(f"{state.info.get('id')}#{turn}".encode())
        if h % self.every == 0:
            msg = self._spoil(msg, tools, h // self.every, state)
        return ModelResponse(message=msg, finish_reason="tool_calls" if msg.get("tool_calls") else "stop")

    @staticmethod
    def _spoil(msg: Message, tools: Sequence[dict[str, Any]] | None, kind: int, state: State) -> Message:
        calls = list(msg.get("tool_calls") or [])
        if not calls:
            if tools and state.info.get("category") in ("irrelevance", "live_irrelevance"):
                name = tools[0]["function"]["name"]
                return {"role": "assistant", "content": None, "tool_calls": [tool_call(name, {}, f"call_{state.id[:8]}_x")]}
            return msg  # an end-of-turn message in multi-turn: leave it
        if kind % 3 == 0:
            return {"role": "assistant", "content": "I would rather not call anything."}
        if kind % 3 == 1 and len(calls) > 1:
            return {**msg, "tool_calls": calls[:-1]}
        first = dict(calls[0])
        fn = dict(first["function"])
        args = json.loads(fn["arguments"] or "{}")
        if args:
            key = sorted(args)[kind % len(args)]
            args[key] = _mutate(args[key], kind)
        else:
            args = {"unexpected": 1}
        fn["arguments"] = json.dumps(args)
        first["function"] = fn
        return {**msg, "tool_calls": [first, *calls[1:]]}
