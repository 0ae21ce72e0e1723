"""Token-in multi-turn (core/tokens.py): from the second turn on, the client sends the prompt as
token ids -- the last turn's prompt + completion ids and the new messages rendered as a
chat-template suffix -- against the real mock server over HTTP."""

from __future__ import annotations

import logging

import pytest

from sandgym.core.clients import OpenAIClient
from sandgym.core.state import State, Turn, TurnTokens
from sandgym.core.testing import MockOpenAIServer, Reply, encode, render
from sandgym.core.tokens import bridge, continuation, turn_tail
from sandgym.core.tools import ToolEnv

pytestmark = pytest.mark.anyio


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


SCRIPT = [
    Reply(tool_calls=[{"name": "add", "arguments": {"a": 1, "b": 2}}]),
    Reply(tool_calls=[{"name": "add", "arguments": {"a": 3, "b": 4}}]),
    Reply(content="3 and 7"),
]


async def _rollout(srv: MockOpenAIServer) -> State:
    env = ToolEnv(tools=[add], dataset=[{"question": "add things", "answer": ""}], system_prompt="sys")
    client = OpenAIClient(srv.base_url, max_retries=0)
    try:
        return await env.rollout(client, "m", env.rows()[0])
    finally:
        await client.aclose()


async def test_later_turns_are_sent_as_token_ids_extending_the_last_turn() -> None:
    with MockOpenAIServer(SCRIPT) as srv:
        state = await _rollout(srv)
    assert state.error is None and len(state.turns) == 3
    assert [t.token_in for t in state.turns] == [False, True, True]
    assert "tokens" not in srv.requests[0]
    for i in (1, 2):
        prev, cur, body = state.turns[i - 1], state.turns[i], srv.requests[i]
        # What was sent: the last turn's ids, then only the tool message(s) and the
        # generation prompt rendered by the server's template.
        new = encode(render(prev.env_response))
        assert body["tokens"] == prev.tokens.prompt_ids + prev.tokens.completion_ids + new
        assert cur.tokens.prompt_ids == body["tokens"]
        # The messages still go along (tool-call parsing, records): text and ids both kept.
        assert body["messages"] == cur.prompt and body["tools"][0]["function"]["name"] == "add"
    # This template is prefix-preserving, so the ids equal the server's own rendering.
    assert state.turns[2].tokens.prompt_ids == encode(render(state.turns[2].prompt))


async def test_a_server_without_the_token_route_gets_messages(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), MockOpenAIServer(SCRIPT, token_in=False) as srv:
        state = await _rollout(srv)
    assert state.error is None and len(state.turns) == 3
    assert [t.token_in for t in state.turns] == [False, False, False]
    assert all("tokens" not in r for r in srv.requests)
    assert sum("sending messages from now on" in r.getMessage() for r in caplog.records) == 1  # said once


def _state(prompt_ids: list[int], completion_ids: list[int], finish: str = "stop") -> State:
    turn = Turn(
        prompt=[{"role": "user", "content": "q"}],
        completion={"role": "assistant", "content": "a"},
        tokens=TurnTokens(prompt_ids=prompt_ids, completion_ids=completion_ids),
        finish_reason=finish,
    )
    return State(turns=[turn])


def test_continuation_only_when_the_messages_extend_the_last_turn() -> None:
    st = _state([1, 2], [3, 9])
    q, a, tool = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}
    assert continuation(st, [q, a, tool]) == ([1, 2, 3, 9], [tool])
    assert continuation(None, [q]) is None
    assert continuation(st, [q, a]) is None  # nothing new
    assert continuation(st, [{"role": "user", "content": "other"}, a, tool]) is None  # history rewritten
    assert continuation(st, [q, {"role": "assistant", "content": "edited"}, tool]) is None
    assert continuation(_state([1, 2], [3, 9], finish="length"), [q, a, tool]) is None  # cut: no end-of-turn
    assert continuation(_state([], [3, 9]), [q, a, tool]) is None  # the server returned no prompt ids


def test_bridge_keeps_the_templates_glue_after_the_end_of_turn_token() -> None:
    E, NL, S, A = 100, 10, 101, 102  # <|im_end|>, "\n", <|im_start|>, "assistant"
    x, y = 120, 121
    # Qwen2.5-like: every message ends "<|im_end|>\n".
    base = [S, A, NL, x, E, NL]
    tail = turn_tail(base, [S, A, NL, y, E, NL])
    assert tail == [E, NL]
    full = base + [S, 7, NL, 50, E, NL, S, A, NL]
    assert bridge(base, tail, full, [60, 61, E]) == [NL, S, 7, NL, 50, E, NL, S, A, NL]
    assert bridge(base, tail, full, [60, 61, 62]) is None  # no end-of-turn token: cannot stitch
    assert bridge(base, tail, [S, A, NL, 99] + full[4:], [60, E]) is None  # base is not a prefix
    # ChatML as sandgym's tiny template writes it: the "\n" belongs to the next message.
    base = [S, A, NL, x, E]
    tail = turn_tail(base, [S, A, NL, y, E])
    assert tail == [E]
    assert bridge(base, tail, base + [NL, S, 7, E], [60, E]) == [NL, S, 7, E]
