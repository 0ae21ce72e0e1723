"""The built-in transformers backend: a real OpenAI-compatible server on 127.0.0.1, reached
with the `openai` client; token ids and logprobs as vLLM returns them, and logprobs that the
trainer's packed varlen path reproduces."""

from __future__ import annotations

from typing import Any

import anyio
import openai
import pytest
import torch

from sandgym.core.clients import ModelError, OpenAIClient, extract_tokens
from sandgym.core.state import State, Turn, TurnTokens
from sandgym.models.tiny import byte_tokenizer, tiny_qwen2
from sandgym.train.attention import use_varlen
from sandgym.train.backends.base import GenRequest, GenResult
from sandgym.train.backends.hf import HFBackend, HFEngine
from sandgym.train.backends.openai_server import parse_tool_calls
from sandgym.train.batch import pack, state_to_sequence
from sandgym.train.logprobs import packed_logprobs
from sandgym.uvicorn_thread import app_in_process


@pytest.fixture(scope="module")
def backend():
    model = tiny_qwen2(seed=3)
    use_varlen(model)
    with HFBackend(model, byte_tokenizer(), model_name="tiny") as b:
        assert b.base_url.startswith("http://127.0.0.1:")
        yield b


def _trainer_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    st = State(turns=[Turn(prompt=[], completion={}, tokens=TurnTokens(prompt_ids=prompt, completion_ids=completion))], advantage=0.0)
    mb = pack([state_to_sequence(st)], 10_000)[0]
    with torch.no_grad():
        lp, _ = packed_logprobs(model, mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, mb.targets, kernel="sdpa")
    return lp[mb.mask.bool()].tolist()


def test_completions_token_ids_and_logprobs_match_trainer(backend: HFBackend) -> None:
    client = openai.OpenAI(base_url=backend.base_url, api_key="x")
    assert [m.id for m in client.models.list().data] == ["tiny"]
    # Two prompts of different lengths in one request: batched with left padding.
    prompts = [[72, 105, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    r = client.completions.create(model="tiny", prompt=prompts, max_tokens=12, n=2, logprobs=1, extra_body={"return_token_ids": True})
    assert len(r.choices) == 4
    for i, ch in enumerate(r.choices):
        extra = ch.model_extra
        assert extra["prompt_token_ids"] == prompts[i // 2]
        ids = extra["token_ids"]
        assert len(ids) == 12 and ch.finish_reason == "length"
        lps = ch.logprobs.token_logprobs
        assert len(lps) == 12 and all(lp <= 0 for lp in lps)
        ref = _trainer_logprobs(backend.engine.model, extra["prompt_token_ids"], ids)
        assert max(abs(a - b) for a, b in zip(lps, ref)) < 1e-4
    assert r.usage.completion_tokens == 48


def test_chat_completions_vllm_shape_read_by_core_client(backend: HFBackend) -> None:
    tok = backend.engine.tokenizer
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]

    async def go():
        c = OpenAIClient(base_url=backend.base_url, api_key="x")
        try:
            return await c.chat(messages, model="tiny", sampling_args={"max_tokens": 6, "temperature": 0.7})
        finally:
            await c.aclose()

    resp = anyio.run(go)
    assert resp.token_source == "return_token_ids"
    assert resp.tokens is not None
    expected_prompt = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
    assert resp.tokens.prompt_ids == expected_prompt
    assert len(resp.tokens.completion_ids) == len(resp.tokens.completion_logprobs) == 6
    ref = _trainer_logprobs(backend.engine.model, resp.tokens.prompt_ids, resp.tokens.completion_ids)
    assert max(abs(a - b) for a, b in zip(resp.tokens.completion_logprobs, ref)) < 1e-4

    # return_tokens_as_token_ids form: tokens spelled "token_id:N"
    client = openai.OpenAI(base_url=backend.base_url, api_key="x")
    r = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=3, logprobs=True, extra_body={"return_tokens_as_token_ids": True}
    )
    toks, src = extract_tokens(r, r.choices[0])
    assert src == "return_token_ids" and toks is not None
    assert [e.token for e in r.choices[0].logprobs.content] == [f"token_id:{i}" for i in toks.completion_ids]


def test_stop_token_and_greedy(backend: HFBackend) -> None:
    client = openai.OpenAI(base_url=backend.base_url, api_key="x")
    a = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=5, temperature=0, extra_body={"return_token_ids": True})
    b = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=5, temperature=0, extra_body={"return_token_ids": True})
    first = a.choices[0].model_extra["token_ids"]
    assert first == b.choices[0].model_extra["token_ids"]  # greedy is deterministic
    c = client.completions.create(
        model="tiny", prompt=[5, 6, 7], max_tokens=5, temperature=0, extra_body={"return_token_ids": True, "stop_token_ids": [first[0]]}
    )
    assert c.choices[0].model_extra["token_ids"] == first[:1]
    assert c.choices[0].finish_reason == "stop"


def test_bad_requests_are_400(backend: HFBackend) -> None:
    client = openai.OpenAI(base_url=backend.base_url, api_key="x")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=[], max_tokens=2)


def test_parse_tool_calls() -> None:
    text = 'let me run it <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "let me run it"
    assert calls[0]["function"] == {"name": "python", "arguments": '{"code": "print(1)"}'}
    assert parse_tool_calls("no calls <tool_call>{broken</tool_call>") == ("no calls <tool_call>{broken</tool_call>", [])


def test_separate_copy_follows_update_weights() -> None:
    model = tiny_qwen2(seed=4)
    b = HFBackend(model, byte_tokenizer(), share_weights=False)
    served = b.engine.model
    assert served is not model
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)  # tied with the embeddings
    assert not torch.equal(served.lm_head.weight, model.lm_head.weight)
    b.update_weights(model)
    assert torch.equal(served.lm_head.weight, model.lm_head.weight)
    assert b.weights_version == 1


def test_server_serves_any_engine_and_a_failed_start_leaves_nothing_running() -> None:
    import threading

    from sandgym.train.backends.hf import HFEngine
    from sandgym.train.backends.openai_server import OpenAIServer

    def engine_threads() -> int:
        return sum(t.name == "sandgym-engine" for t in threading.enumerate())

    engine = HFEngine(tiny_qwen2(seed=5), byte_tokenizer(), max_batch_size=4)
    with pytest.raises(ValueError, match="loopback"):
        OpenAIServer(engine, "direct", host="0.0.0.0")
    base = engine_threads()  # other tests' servers may be running
    srv = OpenAIServer(engine, "direct")  # no backend around it
    srv.start()
    try:
        r = openai.OpenAI(base_url=srv.base_url, api_key="x").completions.create(
            model="direct", prompt=[1, 2, 3], max_tokens=3, extra_body={"return_token_ids": True}
        )
        assert len(r.choices[0].model_extra["token_ids"]) == 3
        assert engine_threads() == base + 1
        with pytest.raises(OSError):
            OpenAIServer(engine, "busy", port=srv.port).start()  # the port is taken
        assert engine_threads() == base + 1  # the failed start closed its batcher
    finally:
        srv.close()
    assert engine_threads() == base


def _engine() -> HFEngine:
    return HFEngine(tiny_qwen2(seed=3), byte_tokenizer(), max_batch_size=8)


def test_a_request_joins_the_batch_being_decoded_and_decodes_as_it_would_alone() -> None:
    """Continuous batching: B arrives while A is being decoded, is prefilled and joins A's
    batch between two decode steps, finishes first and leaves; both decode (greedy) exactly
    the tokens, and nearly the logprobs, they get alone."""
    engine = _engine()
    if not engine.continuous:
        pytest.fail("this transformers keeps no per-layer KV tensors (transformers 4.54+ does)")
    a = GenRequest(prompt_ids=list(b"def add(a, b):"), max_tokens=40, temperature=0.0, ignore_eos=True)
    b = GenRequest(prompt_ids=list(b"x = 1"), max_tokens=6, temperature=0.0, ignore_eos=True)
    alone = engine.generate([a]) + engine.generate([b])
    got: dict[str, GenResult | BaseException] = {}
    calls: list[tuple[bool, int]] = []

    def take(wait: bool, limit: int) -> tuple[list[tuple[GenRequest, Any]], bool]:
        calls.append((wait, limit))
        if len(calls) == 1:
            return [(a, lambda r: got.setdefault("a", r))], False
        if len(calls) == 4:  # A has decoded three tokens
            return [(b, lambda r: got.setdefault("b", r))], False
        if wait:
            return [], True  # the queue closes once the batch is done
        return [], False

    engine.decode_continuously(take)
    assert list(got) == ["b", "a"]  # B joined A's batch and left it first
    assert calls[4] == (False, 6)  # while both were decoded: room for 8 - 2
    for res, ref in zip((got["a"], got["b"]), alone, strict=True):
        assert isinstance(res, GenResult)
        assert res.completion_ids == ref.completion_ids and res.finish_reason == ref.finish_reason == "length"
        assert res.logprobs == pytest.approx(ref.logprobs, abs=1e-4)


def test_shared_prefixes_are_prefilled_once_and_decode_as_without_them() -> None:
    """Prompts that share a long start (a tools block, a GRPO group's prompt) are prefilled
    from a cached prefix: the batch's own prefill covers only what follows it, and every row
    decodes (greedy) the tokens, and nearly the logprobs, of a prefill of the whole prompt.
    A change to the weights (here in place, as an optimizer step on shared weights does)
    invalidates the cached prefix."""
    engine = _engine()
    tools = list(b"<tools>" + bytes(range(40, 120)) + b"</tools>")  # 95 tokens every prompt starts with
    joins = [
        [tools + list(b"question one"), tools + list(b"q2")],  # a batch: the prefix is cached
        [tools + list(b"question three, alone")],  # a lone prompt: the cached prefix serves it
        [tools + list(b"q4") + list(b"?" * 50)] * 2,  # a group: a longer prefix extends the first
        [list(b"no tools here")],  # nothing shared
    ]
    widths: list[int] = []
    forward = engine.model.forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        widths.append(int(kwargs["input_ids"].shape[1]))
        return forward(*args, **kwargs)

    def decode(prompts: list[list[int]]) -> list[GenResult]:
        reqs = [GenRequest(prompt_ids=p, max_tokens=8, temperature=0.0, ignore_eos=True) for p in prompts]
        got: list[GenResult | BaseException] = []
        queue = [[(r, got.append) for r in reqs]]

        def take(wait: bool, limit: int) -> tuple[list[tuple[GenRequest, Any]], bool]:
            return (queue.pop(), False) if queue else ([], wait)

        engine.decode_continuously(take)
        assert all(isinstance(g, GenResult) for g in got), got
        return [g for g in got if isinstance(g, GenResult)]

    for step in range(2):
        engine.model.forward = counting  # type: ignore[method-assign]
        for prompts in joins:
            widths.clear()
            got = decode(prompts)
            longest = max(widths)  # the prefill(s); the 7 decode steps run one token each
            alone = [engine.generate([GenRequest(prompt_ids=p, max_tokens=8, temperature=0.0, ignore_eos=True)])[0] for p in prompts]
            shared = prompts[0][: len(tools)] == tools
            assert (longest < max(map(len, prompts))) == shared, (step, prompts, widths)
            for res, ref in zip(got, alone, strict=True):
                assert res.completion_ids == ref.completion_ids
                assert res.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
        engine.model.forward = forward  # type: ignore[method-assign]
        with torch.no_grad():  # new weights: a cached prefix of the old ones would decode otherwise
            for p in engine.model.parameters():
                p.mul_(1.5)


def test_staged_weights_stop_the_batch_growing_and_serve_the_next() -> None:
    """A weight update while a batch is decoded: the batch takes no new request, finishes on
    the old weights, and what waited is decoded on the new ones."""
    engine = _engine()
    a = GenRequest(prompt_ids=list(b"abc"), max_tokens=10, temperature=0.0, ignore_eos=True)
    b = GenRequest(prompt_ids=list(b"xyz"), max_tokens=3, temperature=0.0, ignore_eos=True)
    got: dict[str, GenResult | BaseException] = {}
    calls: list[bool] = []

    def take(wait: bool, limit: int) -> tuple[list[tuple[GenRequest, Any]], bool]:
        calls.append(wait)
        if len(calls) == 1:
            return [(a, lambda r: got.setdefault("a", r))], False
        if len(calls) == 2:  # a new policy arrives while A decodes; B is queued
            engine.stage(tiny_qwen2(seed=4).state_dict(), 1)
            return [], False
        if len(calls) == 3:
            assert wait, "the batch took requests after weights were staged"
            return [(b, lambda r: got.setdefault("b", r))], False
        return [], True

    engine.decode_continuously(take)
    ra, rb = got["a"], got["b"]
    assert isinstance(ra, GenResult) and isinstance(rb, GenResult)
    assert (ra.policy_version, rb.policy_version) == (0, 1)
    assert len(ra.completion_ids) == 10 and len(rb.completion_ids) == 3


def test_a_batch_that_fails_answers_each_row_once() -> None:
    """The model fails after one row of the batch has finished: that row keeps its result,
    the others get the failure, and no row is answered twice."""
    engine = _engine()
    short = GenRequest(prompt_ids=list(b"abc"), max_tokens=2, temperature=0.0, ignore_eos=True)
    long = GenRequest(prompt_ids=list(b"xyz"), max_tokens=20, temperature=0.0, ignore_eos=True)
    forward = engine.model.forward
    runs: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        if len(runs) == 3:  # prefill, one decode step, then the step after `short` finished
            raise RuntimeError("device lost")
        return forward(*args, **kwargs)

    engine.model.forward = failing  # type: ignore[method-assign]
    answers: dict[str, list[GenResult | BaseException]] = {"short": [], "long": []}
    sent = [False]

    def take(wait: bool, limit: int) -> tuple[list[tuple[GenRequest, Any]], bool]:
        if not sent[0]:
            sent[0] = True
            return [(short, answers["short"].append), (long, answers["long"].append)], False
        return [], wait  # nothing more; the queue closes once the batch is done

    engine.decode_continuously(take)
    assert len(answers["short"]) == 1 and isinstance(answers["short"][0], GenResult)
    assert len(answers["short"][0].completion_ids) == 2
    assert len(answers["long"]) == 1 and isinstance(answers["long"][0], RuntimeError)


def test_the_servers_own_process_calls_its_app_with_the_sockets_answers() -> None:
    """A client in the trainer's process reaches the trainer's server through its app, not
    the socket: the same greedy answer as a client over the socket. Once the server closes
    nothing is offered, and a client made before is refused at once, not left waiting."""
    model = tiny_qwen2(seed=3)
    use_varlen(model)
    messages = [{"role": "user", "content": "hello"}]
    b = HFBackend(model, byte_tokenizer(), model_name="tiny")
    b.start()
    try:
        assert app_in_process(b.base_url) is not None
        client = OpenAIClient(base_url=b.base_url, api_key="x", max_retries=0)

        async def chat() -> Any:
            with anyio.fail_after(60):
                return await client.chat(messages, model="tiny", sampling_args={"max_tokens": 6, "temperature": 0})

        inside = anyio.run(chat)
        over_socket = openai.OpenAI(base_url=b.base_url, api_key="x").chat.completions.create(
            model="tiny", messages=messages, max_tokens=6, temperature=0, extra_body={"return_token_ids": True}
        )
        assert inside.tokens is not None and len(inside.tokens.completion_ids) == 6
        assert inside.tokens.completion_ids == over_socket.choices[0].model_extra["token_ids"]
        assert inside.message["content"] == over_socket.choices[0].message.content
    finally:
        b.close()
    assert app_in_process(b.base_url) is None
    with pytest.raises(ModelError, match="500"):
        anyio.run(chat)
