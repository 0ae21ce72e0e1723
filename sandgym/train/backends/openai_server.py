"""An OpenAI-compatible server on 127.0.0.1 for any InferenceEngine (hf.HFEngine, vllm.VLLMEngine).

It answers `/v1/chat/completions` and `/v1/completions` the way vLLM does when asked for token
ids (`return_token_ids`: `prompt_token_ids` on the response, `token_ids` on each choice;
`logprobs.content[*].logprob` per generated token, tokens as "token_id:N" when
`return_tokens_as_token_ids`), and `policy_version` on each choice: which weights produced it
(the trainer's optimizer steps, for asynchronous training); `/tokenize` as vLLM does; and
prime-rl's token-in route `/v1/chat/completions/tokens` (a chat request whose `tokens` field is
the prompt, generated from as given: core/tokens.py). Logprobs are the engine's raw (temperature 1) log-softmax of
the sampled token, as vLLM's default `raw_logprobs` mode reports. Chats are rendered with the
engine's tokenizer's chat template; Hermes-style tool calls in the output become `tool_calls`.

Concurrent requests are batched: a worker thread collects what is pending (up to the engine's
`max_batch_size`) and calls `engine.generate` once per batch. The server runs uvicorn in its
own thread; `OpenAIServer` owns that thread and the batcher's.

fastapi and uvicorn are imported when a server starts, not at import (the device image runs
the engines without them). No `from __future__ import annotations` here: FastAPI resolves the
route functions' annotations, and `Request` is imported inside build_app.
"""

import asyncio
import json
import logging
import queue
import re
import threading
import time
import uuid
from typing import Any

from sandgym.train.backends.base import Done, GenRequest, GenResult, InferenceEngine
from sandgym.uvicorn_thread import UvicornThread, offer_in_process, withdraw_in_process

log = logging.getLogger(__name__)


class RequestBatcher:
    """Collects concurrent requests into batches of up to `engine.max_batch_size` for one
    worker thread (requests arriving within `window_s` of the first join its batch). An
    engine that batches continuously (`decode_continuously`, the HF engine) takes the queue
    itself: what arrives while it decodes joins the batch in progress."""

    def __init__(self, engine: InferenceEngine, window_s: float = 0.005) -> None:
        self.engine = engine
        self.window_s = window_s
        self.q: queue.Queue[tuple[GenRequest, Done] | None] = queue.Queue()
        self.closed = False
        self._lock = threading.Lock()  # a request is queued before the close's sentinel, or refused
        self.thread = threading.Thread(target=self._run, name="sandgym-engine", daemon=True)
        self.thread.start()

    def submit(self, req: GenRequest, done: Done) -> None:
        with self._lock:
            if self.closed:
                raise RuntimeError("the inference server is closed")
            self.q.put((req, done))

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self.q.put(None)
        self.thread.join(timeout=30)
        # What was queued behind the close is answered, not left waiting: a client calling the
        # app in-process has no connection that closing the socket would break.
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1](RuntimeError("the inference server closed"))

    def take(self, wait: bool, limit: int) -> tuple[list[tuple[GenRequest, Done]], bool]:
        """Up to `limit` queued requests and whether the queue closed. With `wait`: blocks
        for the first, then takes what arrives within `window_s`; without: what is there."""
        batch: list[tuple[GenRequest, Done]] = []
        if wait:
            first = self.q.get()
            if first is None:
                return batch, True
            batch.append(first)
        deadline = time.monotonic() + (self.window_s if wait else 0.0)
        while len(batch) < limit:
            timeout = deadline - time.monotonic()
            try:
                item = self.q.get(timeout=timeout) if timeout > 0 else self.q.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _run(self) -> None:
        decode = getattr(self.engine, "decode_continuously", None)
        if decode is not None and getattr(self.engine, "continuous", False):
            decode(self.take)
            return
        stop = False
        while not stop:
            batch, stop = self.take(True, self.engine.max_batch_size)
            if not batch:
                continue
            try:
                results: list[GenResult | BaseException] = list(self.engine.generate([r for r, _ in batch]))
            except BaseException as exc:  # report to every waiter; keep serving
                log.exception("generation failed")
                results = [exc] * len(batch)
            for (_, cb), res in zip(batch, results, strict=True):
                cb(res)


_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Hermes-style `<tool_call>{"name", "arguments"}</tool_call>` blocks (Qwen's format, as
    vLLM's `hermes` parser reads them). Returns (content without the blocks, tool_calls)."""
    calls: list[dict[str, Any]] = []
    for m in _TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or "name" not in obj:
            continue
        args = obj.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": str(obj["name"]), "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    if not calls:
        return text, []
    return _TOOL_CALL.sub("", text).strip(), calls


def build_app(engine: InferenceEngine, model_name: str, batcher: RequestBatcher) -> Any:
    """The FastAPI app: /v1/models, /health, /v1/chat/completions, /v1/completions; generation
    goes through `batcher` to `engine`."""
    from fastapi import FastAPI, HTTPException, Request

    app = FastAPI(title="sandgym OpenAI-compatible server")
    tok = engine.tokenizer

    async def run(reqs: list[GenRequest]) -> list[GenResult]:
        loop = asyncio.get_running_loop()
        futs = []
        for r in reqs:
            fut: asyncio.Future[GenResult] = loop.create_future()

            def done(res: GenResult | BaseException, fut: asyncio.Future[GenResult] = fut) -> None:
                def settle() -> None:
                    if fut.done():
                        return
                    if isinstance(res, BaseException):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)

                loop.call_soon_threadsafe(settle)

            batcher.submit(r, done)
            futs.append(fut)
        return list(await asyncio.gather(*futs))

    def sampling(body: dict[str, Any]) -> dict[str, Any]:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        return {
            "max_tokens": int(max_tokens),
            "temperature": float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0),
            "top_p": float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0),
            "stop_token_ids": [int(x) for x in body.get("stop_token_ids") or []],
            "ignore_eos": bool(body.get("ignore_eos", False)),
        }

    def token_str(i: int, as_ids: bool) -> str:
        return f"token_id:{i}" if as_ids else tok.decode([i])

    def usage(prompt: int, completion: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "sandgym"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    def render_chat(body: dict[str, Any], add_generation_prompt: bool = True) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(400, "messages must be a non-empty list")
        kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False}
        if body.get("tools"):
            kwargs["tools"] = body["tools"]
        extra = body.get("chat_template_kwargs") or {}
        if not isinstance(extra, dict):
            raise HTTPException(400, "chat_template_kwargs must be an object")
        try:
            text = tok.apply_chat_template(messages, **{**extra, **kwargs})
        except Exception as exc:
            raise HTTPException(400, f"chat template failed: {exc}") from exc
        return list(tok(text, add_special_tokens=False)["input_ids"])

    # The model's vocabulary can be larger than the tokenizer's (rounded-up embeddings): a
    # sampled id the tokenizer lacks is still a valid prompt id. Engines without `vocab_size`
    # check ids themselves (vLLM does).
    vocab = int(getattr(engine, "vocab_size", 0) or 0) or None

    def prompt_tokens(body: dict[str, Any]) -> list[int]:
        ids = body.get("tokens")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise HTTPException(400, "tokens must be a non-empty list of integer token ids")
        bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise HTTPException(400, f"tokens holds ids outside the vocabulary [0, {vocab or '...'}): {bad[:5]}")
        return ids

    async def chat_response(body: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
        if body.get("stream"):
            raise HTTPException(400, "stream is not supported by this server")
        n = int(body.get("n") or 1)
        results = await run([GenRequest(prompt_ids=list(prompt_ids), **sampling(body)) for _ in range(n)])
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        want_lp = bool(body.get("logprobs"))
        choices = []
        for i, r in enumerate(results):
            text_out = tok.decode(r.completion_ids, skip_special_tokens=True)
            content, calls = parse_tool_calls(text_out)
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                msg["tool_calls"] = calls
            choice: dict[str, Any] = {
                "index": i,
                "message": msg,
                "finish_reason": "tool_calls" if calls and r.finish_reason == "stop" else r.finish_reason,
                "logprobs": (
                    {
                        "content": [
                            {"token": token_str(t, as_ids), "logprob": lp, "bytes": None, "top_logprobs": []}
                            for t, lp in zip(r.completion_ids, r.logprobs, strict=True)
                        ]
                    }
                    if want_lp
                    else None
                ),
                "token_ids": list(r.completion_ids),
                "policy_version": r.policy_version,
            }
            choices.append(choice)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "prompt_token_ids": list(prompt_ids),
            "usage": usage(len(prompt_ids), sum(len(r.completion_ids) for r in results)),
        }

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        if body.get("stream"):
            raise HTTPException(400, "stream is not supported by this server")
        return await chat_response(body, render_chat(body))

    @app.post("/v1/chat/completions/tokens")
    async def chat_tokens(request: Request) -> dict[str, Any]:
        """prime-rl's token-in route: a chat request whose `tokens` are the prompt, used as
        given (`messages` and `tools` are not rendered; tool calls are parsed from the output)."""
        body = await request.json()
        return await chat_response(body, prompt_tokens(body))

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        """vLLM's /tokenize: a chat (`messages`, `tools`, `add_generation_prompt` default true,
        `chat_template_kwargs`) or a `prompt` string, to token ids."""
        body = await request.json()
        if "messages" in body:
            ids = render_chat(body, bool(body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            ids = list(tok(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True)))["input_ids"])
        else:
            raise HTTPException(400, "give messages (a chat) or prompt (a string)")
        return {"count": len(ids), "max_model_len": int(getattr(tok, "model_max_length", 0) or 0), "tokens": ids}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        if body.get("stream"):
            raise HTTPException(400, "stream is not supported by this server")
        prompt = body.get("prompt")
        # OpenAI accepts a string, a list of strings, a list of token ids, or a list of lists.
        if isinstance(prompt, str):
            prompts = [tok(prompt, add_special_tokens=False)["input_ids"]]
        elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt:
            prompts = [tok(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p) for p in prompt]
        else:
            raise HTTPException(400, "prompt must be a string, token ids, or a list of them")
        n = int(body.get("n") or 1)
        s = sampling(body)
        reqs = [GenRequest(prompt_ids=list(p), **s) for p in prompts for _ in range(n)]
        results = await run(reqs)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        want_lp = body.get("logprobs") is not None
        choices = []
        for i, (rq, r) in enumerate(zip(reqs, results, strict=True)):
            choices.append(
                {
                    "index": i,
                    "text": tok.decode(r.completion_ids, skip_special_tokens=True),
                    "finish_reason": r.finish_reason,
                    "logprobs": (
                        {
                            "tokens": [token_str(t, as_ids) for t in r.completion_ids],
                            "token_logprobs": list(r.logprobs),
                            "top_logprobs": None,
                            "text_offset": None,
                        }
                        if want_lp
                        else None
                    ),
                    "prompt_token_ids": list(rq.prompt_ids),
                    "token_ids": list(r.completion_ids),
                    "policy_version": r.policy_version,
                }
            )
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": usage(sum(len(p) for p in prompts) * n, sum(len(r.completion_ids) for r in results)),
        }

    return app


class OpenAIServer:
    """`engine` behind build_app's routes, served by uvicorn in a background thread on
    `host` (loopback only; a free port unless `port` is given)."""

    def __init__(self, engine: InferenceEngine, model_name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        if not host.startswith("127."):
            raise ValueError("the OpenAI-compatible server only listens on loopback (127.0.0.0/8)")
        self.engine = engine
        self.model_name = model_name
        self.host = host
        self.port = port
        self._batcher: RequestBatcher | None = None
        self._http: UvicornThread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        self._batcher = RequestBatcher(self.engine)
        try:
            app = build_app(self.engine, self.model_name, self._batcher)
            self._http = UvicornThread(app, host=self.host, port=self.port, name="sandgym-openai-server", lifespan="off")
            self._http.start()
            self.port = self._http.port
            offer_in_process(self.base_url, app)  # the trainer's own rollouts skip the socket
        except BaseException:
            self.close()  # no batcher or server thread left behind
            raise
        log.info("serving %s at %s", self.model_name, self.base_url)

    def close(self) -> None:
        withdraw_in_process(self.base_url)
        if self._http is not None:
            self._http.stop()
        if self._batcher is not None:
            self._batcher.close()
        self._http = self._batcher = None
