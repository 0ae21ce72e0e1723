"""Model clients: the `ModelClient` protocol and the `openai` SDK's async client against any
OpenAI-compatible base URL (asking vLLM for token ids and logprobs; from the second turn of a
rollout on, sending the prompt as token ids: tokens.py). The offline policies (`oracle`,
`null`) are in `policies.py`."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, Field

from sandgym.uvicorn_thread import app_in_process

from .state import Message, State, TurnTokens
from .tokens import STAND_IN, STAND_IN_OTHER, bridge, continuation, turn_tail

log = logging.getLogger(__name__)


class ModelError(RuntimeError):
    """The model could not be reached or answered unusably after all retries."""


class ModelResponse(BaseModel):
    message: Message
    tokens: TurnTokens | None = None
    token_source: str | None = None
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    token_in: bool = False  # the prompt went to the server as token ids (tokens.py)


def _tokenize_response() -> Any:
    """vLLM's `/tokenize` answer (the fields we read), as the openai SDK's own model type (its
    `post` parses only those); made on first use so importing this module stays light."""
    global _TokenizeResponse
    if _TokenizeResponse is None:
        import openai

        class TokenizeResponse(openai.BaseModel):
            tokens: list[int]
            count: int | None = None

        _TokenizeResponse = TokenizeResponse
    return _TokenizeResponse


_TokenizeResponse: Any = None


@runtime_checkable
class ModelClient(Protocol):
    name: str

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        tools: Sequence[dict[str, Any]] | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        state: State | None = None,
    ) -> ModelResponse: ...


def _get(obj: Any, key: str) -> Any:
    """Field of an SDK object or dict, including fields the SDK's schema does not know
    (vLLM's `prompt_token_ids` / `token_ids` arrive as pydantic extras)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    value = getattr(obj, key, None)
    if value is None:
        extra = getattr(obj, "model_extra", None) or {}
        value = extra.get(key)
    return value


def extract_tokens(response: Any, choice: Any) -> tuple[TurnTokens | None, str | None]:
    """Token ids and logprobs the server returned, in either vLLM form:
    - `return_token_ids`: `prompt_token_ids` on the response (or choice), `token_ids` on
      the choice; logprobs from `choice.logprobs.content[*].logprob`.
    - `return_tokens_as_token_ids` only: each logprob entry's token is "token_id:N"; the
      completion ids come from there and there are no prompt ids.
    """
    content = _get(_get(choice, "logprobs"), "content") or []
    logprobs = [float(_get(e, "logprob")) for e in content]
    prompt_ids = _get(response, "prompt_token_ids") or _get(choice, "prompt_token_ids")
    completion_ids = _get(choice, "token_ids")
    version = _get(choice, "policy_version")
    version = int(version) if version is not None else None
    if completion_ids is not None:
        return (
            TurnTokens(
                prompt_ids=list(prompt_ids or []),
                completion_ids=list(completion_ids),
                completion_logprobs=logprobs,
                policy_version=version,
            ),
            "return_token_ids",
        )
    if content:
        ids: list[int] = []
        for e in content:
            tok = str(_get(e, "token") or "")
            if not tok.startswith("token_id:"):
                return None, None  # text tokens only: we never re-tokenize
            ids.append(int(tok.split(":", 1)[1]))
        return (
            TurnTokens(prompt_ids=list(prompt_ids or []), completion_ids=ids, completion_logprobs=logprobs, policy_version=version),
            "logprobs",
        )
    return None, None


def message_from_choice(choice: Any) -> Message:
    msg = _get(choice, "message")
    if msg is None:
        raise ValueError("response choice has no message")
    out: Message = {"role": "assistant", "content": _get(msg, "content")}
    calls = _get(msg, "tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": _get(c, "id") or f"call_{i}",
                "type": "function",
                "function": {
                    "name": _get(_get(c, "function"), "name") or "",
                    "arguments": _get(_get(c, "function"), "arguments") or "",
                },
            }
            for i, c in enumerate(calls)
        ]
    reasoning = _get(msg, "reasoning_content")
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


class OpenAIClient:
    """AsyncOpenAI with our own retry loop (5xx, 429, timeouts, connection errors and
    malformed responses are retried with exponential backoff; other 4xx are not).

    `request_tokens` asks the server for token ids and logprobs (vLLM's extra parameters).
    A server that rejects those parameters with a 400 is asked again without them, once,
    and the client remembers.

    `token_in` (with `request_tokens`): a turn that continues the rollout's previous turn is
    sent as token ids -- the previous prompt + completion ids and the new messages rendered
    as a chat-template suffix through the server's `/tokenize` -- to
    `POST /v1/chat/completions/tokens` (prime-rl's route: a chat request whose `tokens` field
    is the prompt; sandgym's OpenAIServer serves it). A stock `vllm serve` has no such route
    (its chat endpoint takes no prompt ids): on a 404 the client warns once and sends
    messages from then on."""

    name = "openai"

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        request_tokens: bool = True,
        token_in: bool = True,
        default_sampling_args: Mapping[str, Any] | None = None,
    ) -> None:
        from openai import AsyncOpenAI

        self.base_url = base_url
        app = app_in_process(base_url) if base_url else None
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "EMPTY",
            timeout=timeout_s,
            max_retries=0,
            http_client=_in_process_http(app) if app is not None else None,
        )
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.request_tokens = request_tokens
        self.token_in = token_in
        self.default_sampling_args = dict(default_sampling_args or {})
        self._stand_in: dict[str, tuple[list[int], list[int]]] = {}  # tools JSON -> (base, tail)

    async def aclose(self) -> None:
        await self._client.close()

    def _request(self, messages: Sequence[Message], model: str, tools: Any, sampling_args: Mapping[str, Any] | None) -> dict[str, Any]:
        args = {**self.default_sampling_args, **(sampling_args or {})}
        extra_body = dict(args.pop("extra_body", None) or {})
        kwargs: dict[str, Any] = {"model": model, "messages": list(messages), **args}
        if tools:
            kwargs["tools"] = list(tools)
        if self.request_tokens:
            kwargs.setdefault("logprobs", True)
            extra_body.setdefault("return_tokens_as_token_ids", True)
            extra_body.setdefault("return_token_ids", True)
        if extra_body:
            kwargs["extra_body"] = extra_body
        return kwargs

    @staticmethod
    def _retryable(exc: BaseException) -> bool:
        import openai

        if isinstance(exc, openai.APIStatusError):
            return exc.status_code >= 500 or exc.status_code in (408, 409, 429)
        # Timeouts, connection failures, and bodies that are not the JSON we expect.
        return isinstance(exc, (openai.APIConnectionError, openai.APIResponseValidationError, ValueError, TypeError, KeyError))

    def _root(self) -> Any:
        """The client at the server's root (vLLM serves /tokenize beside /v1, not under it)."""
        base = str(self._client.base_url).rstrip("/")
        return self._client.with_options(base_url=base.removesuffix("/v1"))

    async def _tokenize(self, messages: Sequence[Message], model: str, tools: Any, add_generation_prompt: bool) -> list[int]:
        body: dict[str, Any] = {"model": model, "messages": list(messages), "add_generation_prompt": add_generation_prompt}
        if tools:
            body["tools"] = list(tools)
        resp = await self._root().post("/tokenize", body=body, cast_to=_tokenize_response())
        return list(resp.tokens)

    async def _token_prompt(self, messages: Sequence[Message], model: str, tools: Any, state: State | None) -> list[int] | None:
        """The prompt as token ids when this turn continues the last one (tokens.py), else
        None (send messages)."""
        cont = continuation(state, messages)
        if cont is None:
            return None
        prefix, new = cont
        key = json.dumps(list(tools or []), sort_keys=True, default=str)
        if key not in self._stand_in:
            base = await self._tokenize([STAND_IN], model, tools, False)
            other = await self._tokenize([STAND_IN_OTHER], model, tools, False)
            self._stand_in[key] = (base, turn_tail(base, other))
        base, tail = self._stand_in[key]
        full = await self._tokenize([STAND_IN, *new], model, tools, True)
        completion = state.turns[-1].tokens.completion_ids if state is not None and state.turns[-1].tokens else []
        suffix = bridge(base, tail, full, completion)
        if suffix is None:
            log.debug("this turn cannot be sent as token ids (no end-of-turn token, or the template is not a suffix); sending messages")
            return None
        return prefix + suffix

    async def _create(self, messages: Sequence[Message], model: str, tools: Any, sampling_args: Any, prompt_ids: list[int] | None) -> Any:
        """The chat completion as the server's JSON (a dict). Posted as it is: the SDK's
        `chat.completions.create` walks every request against its TypedDicts and builds
        pydantic models of the answer (together ~1.5 ms a call, most of a rollout's own cost
        against a fast server), none of which plain JSON needs. Errors, retries and timeouts
        are still the SDK's."""
        kwargs = self._request(messages, model, tools, sampling_args)
        body = {**{k: v for k, v in kwargs.items() if k != "extra_body"}, **kwargs.get("extra_body", {})}
        path = "/chat/completions"
        if prompt_ids is not None:
            body["tokens"] = prompt_ids
            path += "/tokens"
        return await self._client.post(path, body=body, cast_to=dict)

    def _no_token_in(self, exc: BaseException) -> bool:
        """The server has no token-in route (or /tokenize): stop trying, say so once."""
        import openai

        if isinstance(exc, openai.APIStatusError) and exc.status_code in (404, 405):
            log.warning(
                "%s has no /v1/chat/completions/tokens or /tokenize route (%s); sending messages from now on: "
                "multi-turn prompts are re-rendered by the server, and the trainer checks that they extend the last turn",
                self.base_url or "the server",
                exc.status_code,
            )
            self.token_in = False
            return True
        return False

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        tools: Sequence[dict[str, Any]] | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        state: State | None = None,
    ) -> ModelResponse:
        import openai

        attempt = 0
        fell_back = False
        while True:
            prompt_ids: list[int] | None = None
            try:
                if self.request_tokens and self.token_in:
                    try:
                        prompt_ids = await self._token_prompt(messages, model, tools, state)
                    except openai.APIStatusError as exc:
                        if not self._no_token_in(exc):
                            raise
                try:
                    resp = await self._create(messages, model, tools, sampling_args, prompt_ids)
                except openai.APIStatusError as exc:
                    if prompt_ids is None or not self._no_token_in(exc):
                        raise
                    prompt_ids = None
                    resp = await self._create(messages, model, tools, sampling_args, None)
                choices = _get(resp, "choices") if isinstance(resp, Mapping) else None
                if not choices or not isinstance(choices, list):
                    raise ValueError(f"malformed response: {str(resp)[:200]!r}")
                choice = choices[0]
                message = message_from_choice(choice)
                tokens, source = extract_tokens(resp, choice) if self.request_tokens else (None, None)
                if tokens is not None and prompt_ids is not None and not tokens.prompt_ids:
                    tokens.prompt_ids = list(prompt_ids)  # what we sent is what it generated from
                usage = {}
                counts = _get(resp, "usage")
                if counts is not None:
                    usage = {"prompt_tokens": _get(counts, "prompt_tokens") or 0, "completion_tokens": _get(counts, "completion_tokens") or 0}
                return ModelResponse(
                    message=message,
                    tokens=tokens,
                    token_source=source,
                    finish_reason=_get(choice, "finish_reason"),
                    usage=usage,
                    token_in=prompt_ids is not None,
                )
            except openai.BadRequestError as exc:
                if self.request_tokens and not fell_back and _mentions_token_params(exc):
                    log.warning("server rejected token-id parameters; continuing without token ids: %s", exc)
                    self.request_tokens = False
                    fell_back = True
                    continue
                raise ModelError(f"model request rejected: {exc}") from exc
            except Exception as exc:
                if not self._retryable(exc) or attempt >= self.max_retries:
                    raise ModelError(f"model call failed after {attempt + 1} attempt(s): {type(exc).__name__}: {exc}") from exc
                delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)
                log.info("model call failed (%s); retry %d/%d in %.2fs", type(exc).__name__, attempt + 1, self.max_retries, delay)
                attempt += 1
                await anyio.sleep(delay)


def _in_process_http(app: Any) -> Any:
    """An HTTP client of the openai SDK's kind (httpx for openai 1.x, httpx2 for 3.x) that calls
    `app` in this process. An app's unhandled error is a 500, as a server would answer (and
    retried the same way). With 128 rollouts in flight, the connection pool's bookkeeping and
    the loopback sockets were about a third of a trainer step's Python time."""
    import importlib

    import openai

    base = openai.DefaultAsyncHttpxClient
    httpx = importlib.import_module(base.__mro__[1].__module__.split(".")[0])
    return base(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False))


def _mentions_token_params(exc: Exception) -> bool:
    text = str(exc).lower()
    return any(p in text for p in ("return_token", "logprobs", "extra", "unrecognized", "unexpected"))
