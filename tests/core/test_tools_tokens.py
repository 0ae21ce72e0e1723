"""Tool-call handling and token ids, against the real mock OpenAI server over HTTP."""

import json

import pytest

from sandgym.core.clients import ModelError, OpenAIClient
from sandgym.core.decorators import cleanup, stop, teardown
from sandgym.core.environment import MultiTurnEnv, SingleTurnEnv
from sandgym.core.testing import MockOpenAIServer, Reply, decode, last_user
from sandgym.core.tools import ToolEnv, tool_schema

pytestmark = pytest.mark.anyio


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"exploded: {reason}")


def test_tool_schema_from_signature_and_docstring() -> None:
    s = tool_schema(add)["function"]
    assert s["name"] == "add" and s["description"] == "Add two integers."
    assert s["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first number."}
    assert s["parameters"]["properties"]["b"]["default"] == 0
    assert s["parameters"]["required"] == ["a"]


async def test_bad_tool_calls_go_back_to_the_model_as_errors() -> None:
    script = [
        Reply(tool_calls=[{"name": "add", "arguments": '{"a": 1, "b": '}]),  # bad JSON
        Reply(tool_calls=[{"name": "subtract", "arguments": {"a": 1}}]),  # unknown tool
        Reply(tool_calls=[{"name": "add", "arguments": {"x": 1}}]),  # wrong argument name
        Reply(tool_calls=[{"name": "add", "arguments": "[1, 2]"}]),  # not an object
        Reply(tool_calls=[{"name": "explode", "arguments": {"reason": "test"}}]),  # tool raises
        Reply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}]),  # fine
        Reply(content="5"),
    ]
    with MockOpenAIServer(script) as srv:
        env = ToolEnv(tools=[add, explode], dataset=[{"question": "2+3?", "answer": "5"}])
        client = OpenAIClient(srv.base_url, max_retries=0)
        state = await env.rollout(client, "m", env.rows()[0])
        await client.aclose()
    assert state.error is None, state.error
    assert state.stop_reason == "no_tools_called"
    results = [t.env_response[0]["content"] for t in state.turns[:-1]]
    assert results[0].startswith("Error: could not parse arguments for 'add'")
    assert results[1].startswith("Error: unknown tool 'subtract'") and "add, explode" in results[1]
    assert results[2].startswith("Error: bad arguments for 'add'")
    assert results[3].startswith("Error: could not parse arguments") and "JSON object" in results[3]
    assert results[4] == "Error: RuntimeError: exploded: test"
    assert results[5] == "5"
    assert state.metrics["tool_errors"] == 5 and state.metrics["tool_calls"] == 6
    # every error message was sent back to the model as a tool message with the call's id
    last_req = srv.requests[-1]["messages"]
    tool_msgs = [m for m in last_req if m["role"] == "tool"]
    assert len(tool_msgs) == 6
    calls = [m["tool_calls"][0]["id"] for m in last_req if m.get("tool_calls")]
    assert [m["tool_call_id"] for m in tool_msgs] == calls
    assert srv.requests[0]["tools"][0]["function"]["name"] == "add"


async def test_token_ids_and_logprobs_are_carried_across_turns() -> None:
    script = [
        Reply(tool_calls=[{"name": "add", "arguments": {"a": 1, "b": 2}}]),
        Reply(tool_calls=[{"name": "add", "arguments": {"a": 3, "b": 4}}]),
        Reply(content="The answers are 3 and 7."),
    ]
    with MockOpenAIServer(script) as srv:
        env = ToolEnv(tools=[add], dataset=[{"question": "add things", "answer": ""}], system_prompt="sys")
        client = OpenAIClient(srv.base_url, max_retries=0)
        state = await env.rollout(client, "m", env.rows()[0])
        await client.aclose()
    assert state.error is None and len(state.turns) == 3 and state.has_tokens
    # we asked for them the vLLM way
    body = srv.requests[0]
    assert body["logprobs"] is True and body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    for t in state.turns:
        assert t.token_source == "return_token_ids"
        assert len(t.tokens.completion_logprobs) == len(t.tokens.completion_ids) > 0
        assert all(lp < 0 for lp in t.tokens.completion_logprobs)
    # Each turn's prompt ids start with the previous turn's prompt + completion ids: the
    # trajectory is one token sequence with env tokens in between, never re-tokenized.
    for prev, cur in zip(state.turns, state.turns[1:]):
        head = prev.tokens.prompt_ids + prev.tokens.completion_ids
        assert cur.tokens.prompt_ids[: len(head)] == head
        assert len(cur.tokens.prompt_ids) > len(head)  # tool result tokens follow
    assert decode(state.turns[-1].tokens.completion_ids).startswith("The answers are 3 and 7.")
    assert state.usage["completion_tokens"] == sum(len(t.tokens.completion_ids) for t in state.turns)
    # the state round-trips through JSON (what eval records and the trainer read)
    again = type(state).model_validate(json.loads(state.model_dump_json()))
    assert again.turns[1].tokens == state.turns[1].tokens


async def test_completion_ids_from_logprob_tokens_when_only_that_is_returned() -> None:
    with MockOpenAIServer([Reply(content="hello")]) as srv:
        env = SingleTurnEnv(dataset=[{"question": "hi", "answer": "hello"}])
        client = OpenAIClient(srv.base_url, max_retries=0, default_sampling_args={"extra_body": {"return_token_ids": False}})
        state = await env.rollout(client, "m", env.rows()[0])
        await client.aclose()
    t = state.turns[0]
    assert t.token_source == "logprobs"
    assert decode(t.tokens.completion_ids).startswith("hello")
    assert t.tokens.prompt_ids == []


async def test_model_5xx_after_retries_marks_only_that_rollout() -> None:
    def responder(body):
        if "FAIL" in last_user(body):
            return Reply(status=503)
        return Reply(content="fine")

    with MockOpenAIServer(responder) as srv:
        env = SingleTurnEnv(dataset=[{"question": q, "answer": "fine"} for q in ["a", "FAIL", "b"]])
        client = OpenAIClient(srv.base_url, max_retries=2, backoff_s=0.01)
        states = await env.generate(client, "m", split="eval")
        await client.aclose()
    by_q = {s.prompt[-1]["content"]: s for s in states}
    assert by_q["FAIL"].error and "503" in by_q["FAIL"].error and by_q["FAIL"].stop_reason == "error"
    assert by_q["FAIL"].reward == 0.0
    assert by_q["a"].error is None and by_q["b"].error is None
    fails = [r for r in srv.requests if "FAIL" in last_user(r)]
    assert len(fails) == 3  # first try + 2 retries


async def test_malformed_json_and_timeouts_are_retried() -> None:
    script = [Reply(malformed=True), Reply(delay_s=2.0, content="late"), Reply(content="ok")]
    with MockOpenAIServer(script) as srv:
        client = OpenAIClient(srv.base_url, max_retries=3, backoff_s=0.01, timeout_s=0.5)
        resp = await client.chat([{"role": "user", "content": "x"}], model="m")
        assert resp.message["content"] == "ok"
        assert len(srv.requests) == 3
        srv.push(Reply(status=400))
        with pytest.raises(ModelError):  # a 400 is not retried
            await client.chat([{"role": "user", "content": "x"}], model="m")
        assert len(srv.requests) == 4
        await client.aclose()


async def test_stop_cleanup_teardown_decorators_and_rollout_timeout() -> None:
    events: list[str] = []

    class Echo(MultiTurnEnv):
        async def env_response(self, messages, state):
            return [{"role": "user", "content": f"again {len(state.turns)}"}]

        @stop
        async def said_done(self, state) -> bool:
            return "done" in (state.turns[-1].completion.get("content") or "") if state.turns else False

        @cleanup
        def note(self, state) -> None:
            events.append(f"cleanup {state.stop_reason}")

        @teardown
        async def bye(self) -> None:
            events.append("teardown")

    script = [Reply(content="one"), Reply(content="two"), Reply(content="done now")]
    with MockOpenAIServer(script, default=Reply(content="slow", delay_s=3)) as srv:
        env = Echo(dataset=[{"question": "go", "answer": ""}], max_turns=10)
        client = OpenAIClient(srv.base_url, max_retries=0)
        state = await env.rollout(client, "m", env.rows()[0])
        assert state.stop_reason == "said_done" and len(state.turns) == 3
        env.max_turns = 2
        srv.push(Reply(content="a"), Reply(content="b"))
        state = await env.rollout(client, "m", env.rows()[0])
        assert state.stop_reason == "max_turns_reached" and len(state.turns) == 2
        env.timeout_s = 0.5  # the next replies are slow: the rollout times out, cleanup still runs
        env.max_turns = 10
        state = await env.rollout(client, "m", env.rows()[0])
        assert state.stop_reason == "timeout" and state.error.startswith("TimeoutError")
        await env.close()
        await client.aclose()
    assert events == ["cleanup said_done", "cleanup max_turns_reached", "cleanup timeout", "teardown"]
