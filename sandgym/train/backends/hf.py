"""Built-in transformers inference backend: an OpenAI-compatible server on 127.0.0.1.

It answers `/v1/chat/completions` and `/v1/completions` the way vLLM does when asked for token
ids (`return_token_ids`: `prompt_token_ids` on the response, `token_ids` on each choice;
`logprobs.content[*].logprob` per generated token, tokens as "token_id:N" when
`return_tokens_as_token_ids`). Logprobs are the model's raw (temperature 1) log-softmax of
the sampled token, as vLLM's default `raw_logprobs` mode reports.

The engine shares the trainer's model object by default (`share_weights=True`), so new
weights are served as soon as the optimizer steps; with `share_weights=False` it keeps its own
copy and `update_weights` copies the trainer's state into it (what bounded-staleness overlap
needs: generation on version n while training produces n+1).

Concurrent requests are batched: a worker thread collects what is pending (up to
`max_batch_size`) and decodes them together with a KV cache.
"""


import asyncio
import contextlib
import copy
import json
import logging
import queue
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class GenResult:
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


class HFEngine:
    """Batched sampling with a KV cache, returning token ids and raw logprobs."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        device: torch.device | str | None = None,
        autocast_dtype: torch.dtype | None = None,
        max_batch_size: int = 64,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.max_batch_size = max_batch_size
        self.lock = threading.Lock()  # held while generating or while weights change
        eos = set()
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for e in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if e is not None:
                eos.add(int(e))
        self.eos_ids = sorted(eos)
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.pad_id = int(pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0))

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        out: list[GenResult] = []
        for s in range(0, len(reqs), self.max_batch_size):
            with self.lock:
                out.extend(self._generate(reqs[s : s + self.max_batch_size]))
        return out

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @torch.no_grad()
    def _generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        from transformers import DynamicCache

        model = self.model
        was_training = model.training
        model.eval()  # also keeps gradient checkpointing from disabling the cache
        try:
            dev = self.device
            b = len(reqs)
            lens = [len(r.prompt_ids) for r in reqs]
            if min(lens) == 0:
                raise ValueError("empty prompt")
            width = max(lens)
            ids = torch.full((b, width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((b, width), dtype=torch.long)
            for i, r in enumerate(reqs):  # left padding: every row's last token is at -1
                ids[i, width - lens[i] :] = torch.tensor(r.prompt_ids, dtype=torch.long)
                mask[i, width - lens[i] :] = 1
            ids, mask = ids.to(dev), mask.to(dev)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            temps = torch.tensor([max(r.temperature, 0.0) for r in reqs], device=dev).unsqueeze(-1)
            greedy = temps.squeeze(-1) <= 0.0
            top_p = torch.tensor([r.top_p for r in reqs], device=dev).unsqueeze(-1)
            max_new = torch.tensor([r.max_tokens for r in reqs], device=dev)
            stop_sets = [set(r.stop_token_ids) | (set() if r.ignore_eos else set(self.eos_ids)) for r in reqs]
            stop_mat = torch.zeros((b, int(model.config.vocab_size)), dtype=torch.bool, device=dev)
            for i, st in enumerate(stop_sets):
                if st:
                    stop_mat[i, torch.tensor(sorted(st), device=dev)] = True
            cache = DynamicCache(config=model.config)
            with self._autocast():
                res = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = res.logits[:, -1].float()
            toks: list[torch.Tensor] = []
            lps: list[torch.Tensor] = []
            done = torch.zeros(b, dtype=torch.bool, device=dev)
            ended_by_stop = torch.zeros(b, dtype=torch.bool, device=dev)
            n_out = torch.zeros(b, dtype=torch.long, device=dev)
            for step in range(int(max_new.max())):
                logp = torch.log_softmax(logits, dim=-1)
                scaled = logits / torch.where(temps > 0, temps, torch.ones_like(temps))
                probs = torch.softmax(scaled, dim=-1)
                if bool((top_p < 1.0).any()):
                    sp, si = probs.sort(dim=-1, descending=True)
                    keep = (sp.cumsum(-1) - sp) < top_p
                    sp = sp * keep
                    probs = torch.zeros_like(probs).scatter_(-1, si, sp)
                    probs = probs / probs.sum(-1, keepdim=True)
                tok = torch.multinomial(probs, 1).squeeze(-1)
                tok = torch.where(greedy, logits.argmax(-1), tok)
                tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
                toks.append(tok)
                lps.append(logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
                n_out = n_out + (~done).long()
                hit_stop = stop_mat.gather(-1, tok.unsqueeze(-1)).squeeze(-1) & ~done
                ended_by_stop |= hit_stop
                done = done | hit_stop | (n_out >= max_new)
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=dev)], dim=-1)
                pos = pos[:, -1:] + 1
                with self._autocast():
                    res = model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
                logits = res.logits[:, -1].float()
            tok_mat = torch.stack(toks, 1).cpu()
            lp_mat = torch.stack(lps, 1).float().cpu()
            n_list = n_out.cpu().tolist()
            stop_list = ended_by_stop.cpu().tolist()
            return [
                GenResult(
                    completion_ids=tok_mat[i, : n_list[i]].tolist(),
                    logprobs=lp_mat[i, : n_list[i]].tolist(),
                    finish_reason="stop" if stop_list[i] else "length",
                )
                for i in range(b)
            ]
        finally:
            model.train(was_training)


class _Batcher:
    """Collects concurrent requests into batches for one worker thread."""

    def __init__(self, engine: HFEngine, window_s: float = 0.005) -> None:
        self.engine = engine
        self.window_s = window_s
        self.q: queue.Queue[tuple[GenRequest, Callable[[GenResult | BaseException], None]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="sandgym-hf-engine", daemon=True)
        self.thread.start()

    def submit(self, req: GenRequest, done: Callable[[GenResult | BaseException], None]) -> None:
        self.q.put((req, done))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            first = self.q.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.window_s
            stop = False
            while len(batch) < self.engine.max_batch_size:
                timeout = deadline - time.monotonic()
                try:
                    item = self.q.get(timeout=max(timeout, 0.0)) if timeout > 0 else self.q.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            try:
                results: list[GenResult | BaseException] = list(self.engine.generate([r for r, _ in batch]))
            except BaseException as exc:  # report to every waiter; keep serving
                log.exception("generation failed")
                results = [exc] * len(batch)
            for (_, cb), res in zip(batch, results):
                cb(res)
            if stop:
                return


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


def build_app(engine: HFEngine, model_name: str) -> Any:
    from fastapi import FastAPI, HTTPException, Request

    app = FastAPI(title="sandgym transformers backend")
    batcher = _Batcher(engine)
    app.state.batcher = batcher
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

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        if body.get("stream"):
            raise HTTPException(400, "stream is not supported by the transformers backend")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(400, "messages must be a non-empty list")
        kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
        if body.get("tools"):
            kwargs["tools"] = body["tools"]
        try:
            text = tok.apply_chat_template(messages, **kwargs)
        except Exception as exc:
            raise HTTPException(400, f"chat template failed: {exc}") from exc
        prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
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
                            for t, lp in zip(r.completion_ids, r.logprobs)
                        ]
                    }
                    if want_lp
                    else None
                ),
                "token_ids": list(r.completion_ids),
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

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        if body.get("stream"):
            raise HTTPException(400, "stream is not supported by the transformers backend")
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
        for i, (rq, r) in enumerate(zip(reqs, results)):
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


class HFBackend:
    """The transformers backend: HFEngine behind an OpenAI-compatible uvicorn server on
    127.0.0.1 (a free port unless `port` is given), run in a background thread."""

    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        model_name: str = "sandgym-policy",
        share_weights: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 64,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        if not host.startswith("127."):
            raise ValueError("the transformers backend only listens on loopback (127.0.0.0/8)")
        self.model_name = model_name
        self.share_weights = share_weights
        served = model if share_weights else copy.deepcopy(model)
        if not share_weights:
            served.requires_grad_(False)
        self.engine = HFEngine(served, tokenizer, autocast_dtype=autocast_dtype, max_batch_size=max_batch_size)
        self.host = host
        self.port = port
        self.weights_version = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._app: Any = None

    @classmethod
    def for_engine(cls, engine: Any, model_name: str, host: str = "127.0.0.1", port: int = 0) -> "HFBackend":
        """The HTTP front for another engine with HFEngine's interface (generate, tokenizer,
        max_batch_size, lock), e.g. the vLLM engine."""
        if not host.startswith("127."):
            raise ValueError("the backend server only listens on loopback (127.0.0.0/8)")
        b = cls.__new__(cls)
        b.model_name = model_name
        b.share_weights = True
        b.engine = engine
        b.host, b.port = host, port
        b.weights_version = 0
        b._server = b._thread = b._app = None
        return b

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        import uvicorn

        self._app = build_app(self.engine, self.model_name)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="sandgym-hf-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("transformers backend server did not start")
            time.sleep(0.01)
        log.info("transformers backend serving %s at %s", self.model_name, self.base_url)

    def update_weights(self, model: torch.nn.Module) -> None:
        if not self.share_weights:
            with self.engine.lock, torch.no_grad():
                self.engine.model.load_state_dict(model.state_dict())
        self.weights_version += 1

    def sleep(self) -> None:  # the engine holds no memory beyond the (shared) weights
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._app is not None:
            self._app.state.batcher.close()
        self._server = self._thread = self._app = None

    def __enter__(self) -> "HFBackend":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
