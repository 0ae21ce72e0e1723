"""A small OpenAI-compatible chat server for tests (FastAPI + uvicorn on 127.0.0.1, a free
port, in a background thread). Replies are scripted: a list consumed in order, or a
function of the request. Token ids and logprobs come back the way vLLM returns them:

- `logprobs: true` -> `choice.logprobs.content[*]` with `logprob`, and `token` as
  "token_id:N" when `return_tokens_as_token_ids` is set;
- `return_token_ids: true` -> `prompt_token_ids` on the response and `token_ids` on the choice.

Token ids come from a toy byte-level "chat template" (`render`), so the prompt ids of turn
k+1 begin with turn k's prompt ids followed by its completion ids, as with a real template.
With `token_in` (default) it also answers `/tokenize` and `/v1/chat/completions/tokens` (the
prompt is the request's `tokens`, used as given), like sandgym's OpenAIServer.
Failure modes: an HTTP status (e.g. 500), a delay (to trip client timeouts), malformed JSON.
`stream: true` requests get the same reply as server-sent events.

    with MockOpenAIServer([Reply(content="hi")]) as srv:
        client = OpenAIClient(srv.base_url)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from sandgym.uvicorn_thread import UvicornThread


class Reply(BaseModel):
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI shape, or {"name", "arguments"}
    finish_reason: str | None = None
    status: int | None = None  # reply with this HTTP error status instead
    delay_s: float = 0.0
    malformed: bool = False  # a 200 whose body is not JSON
    extra: dict[str, Any] = Field(default_factory=dict)  # merged into the response body


Responder = Callable[[dict[str, Any]], Reply]

TOKEN_OFFSET = 3  # byte b -> token id b + 3 (0..2 are reserved), so ids are never bytes


def render_message(m: dict[str, Any]) -> str:
    text = f"<|{m.get('role')}|>"
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    text += content or ""
    for c in m.get("tool_calls") or []:
        fn = c.get("function", {})
        text += f"<tool_call>{fn.get('name')}:{fn.get('arguments')}</tool_call>"
    return text + "<|end|>"


def render(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """Toy chat template: the prompt ends with the assistant header."""
    return "".join(render_message(m) for m in messages) + ("<|assistant|>" if add_generation_prompt else "")


def encode(text: str) -> list[int]:
    return [b + TOKEN_OFFSET for b in text.encode()]


def decode(ids: Sequence[int]) -> str:
    return bytes(i - TOKEN_OFFSET for i in ids).decode(errors="replace")


def completion_text(content: str | None, tool_calls: Sequence[dict[str, Any]] | None) -> str:
    """What the assistant message looks like after the header (its tokens)."""
    return render_message({"role": "", "content": content, "tool_calls": tool_calls})[len("<||>") :]


def normalize_calls(calls: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not calls:
        return None
    out = []
    for c in calls:
        if "function" in c:
            out.append({"id": c.get("id") or f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": dict(c["function"])})
        else:
            args = c.get("arguments", {})
            out.append(
                {
                    "id": c.get("id") or f"call_{uuid.uuid4().hex[:8]}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
                }
            )
    return out


class MockOpenAIServer:
    def __init__(
        self,
        script: Sequence[Reply] | Responder | None = None,
        *,
        default: Reply | None = None,
        model: str = "mock",
        token_in: bool = True,
    ) -> None:
        # token_in: serve /tokenize and /v1/chat/completions/tokens (prime-rl's token-in
        # route, as sandgym's OpenAIServer does); off: a server with chat completions only.
        self.token_in = token_in
        self._lock = threading.Lock()
        self._queue: list[Reply] = list(script) if isinstance(script, Sequence) else []
        self._responder: Responder | None = script if callable(script) else None
        self.default = default or Reply(content="ok")
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self._http: UvicornThread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            if self._responder is not None:
                return self._responder(body)
            if self._queue:
                return self._queue.pop(0)
            return self.default

    def build_response(self, body: dict[str, Any], reply: Reply, prompt_ids: list[int] | None = None) -> dict[str, Any]:
        calls = normalize_calls(reply.tool_calls)
        if prompt_ids is None:
            prompt_ids = encode(render(body.get("messages", [])))
        comp_ids = encode(completion_text(reply.content, calls))
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            message["tool_calls"] = calls
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop"),
            "logprobs": None,
        }
        extra = body.get("extra_body") or {}
        flag = lambda k: bool(body.get(k, extra.get(k)))  # noqa: E731 - the SDK merges extra_body into the body
        if body.get("logprobs"):
            as_ids = flag("return_tokens_as_token_ids")
            choice["logprobs"] = {
                "content": [
                    {
                        "token": f"token_id:{t}" if as_ids else chr(max(t - TOKEN_OFFSET, 0)),
                        "logprob": -0.01 * ((i % 7) + 1),
                        "bytes": [max(t - TOKEN_OFFSET, 0)],
                        "top_logprobs": [],
                    }
                    for i, t in enumerate(comp_ids)
                ]
            }
        resp: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(comp_ids), "total_tokens": len(prompt_ids) + len(comp_ids)},
        }
        if flag("return_token_ids"):
            resp["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = comp_ids
        resp.update(reply.extra)
        return resp

    @staticmethod
    async def sse_chunks(body: dict[str, Any], resp: dict[str, Any]) -> Any:
        """The same reply as server-sent events (`stream: true`): one delta chunk with the
        content, tool calls and logprobs, a finish chunk, the usage chunk when asked, [DONE]."""
        choice = resp["choices"][0]
        msg = choice["message"]
        base = {k: resp[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(msg["tool_calls"])]
        first: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": choice.get("logprobs"), "finish_reason": None}
        if "token_ids" in choice:
            first["token_ids"] = choice["token_ids"]
        chunks = [base | {"choices": [first]} | ({"prompt_token_ids": resp["prompt_token_ids"]} if "prompt_token_ids" in resp else {})]
        chunks.append(base | {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append(base | {"choices": [], "usage": resp["usage"]})
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def app(self) -> Any:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "sandgym"}]}

        async def answer(body: dict[str, Any], prompt_ids: list[int] | None) -> Any:
            reply = self._next(body)
            if reply.delay_s:
                await anyio.sleep(reply.delay_s)
            if reply.status is not None:
                return JSONResponse({"error": {"message": f"scripted error {reply.status}", "type": "server_error"}}, status_code=reply.status)
            if reply.malformed:
                return Response(b'{"id": "x", "choices": [ this is not json', media_type="application/json")
            resp = self.build_response(body, reply, prompt_ids)
            if body.get("stream"):
                return StreamingResponse(self.sse_chunks(body, resp), media_type="text/event-stream")
            return JSONResponse(resp)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await answer(await request.json(), None)

        if self.token_in:

            @app.post("/v1/chat/completions/tokens")
            async def chat_tokens(request: Request) -> Any:
                body = await request.json()
                return await answer(body, [int(t) for t in body["tokens"]])

            @app.post("/tokenize")
            async def tokenize(request: Request) -> Any:
                body = await request.json()
                ids = encode(render(body["messages"], bool(body.get("add_generation_prompt", True))))
                return {"count": len(ids), "max_model_len": 1 << 20, "tokens": ids}

        return app

    def start(self, port: int = 0) -> MockOpenAIServer:
        self._http = UvicornThread(self.app(), port=port, name="mock-openai-server", access_log=False, lifespan="off")
        self._http.start()
        self.port = self._http.port
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()

    def __enter__(self) -> MockOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(script_file: str | None = None, port: int = 0) -> None:  # pragma: no cover - manual use
    """`python -m sandgym.core.testing [REPLIES.json] [--port N]`: run a server replying "ok"
    (or a JSON list of replies) on 127.0.0.1:N (default: a free port), printing its base URL."""
    replies = [Reply(**r) for r in json.load(open(script_file))] if script_file else None
    srv = MockOpenAIServer(replies).start(port)
    print(srv.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        srv.stop()


if __name__ == "__main__":  # pragma: no cover
    import argparse

    cli = argparse.ArgumentParser(prog="python -m sandgym.core.testing", description="A mock OpenAI-compatible server.")
    cli.add_argument("replies", nargs="?", help="JSON list of replies (default: always 'ok')")
    cli.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    opts = cli.parse_args()
    serve_forever(opts.replies, opts.port)


def last_user(body: dict[str, Any]) -> str:
    """The last user message's text in a recorded request (for responders)."""
    for m in reversed(body.get("messages", [])):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else json.dumps(c)
    return ""
