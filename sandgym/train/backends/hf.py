"""The built-in transformers inference backend: HFEngine (batched sampling with a KV cache)
behind an OpenAI-compatible server on 127.0.0.1 (openai_server.OpenAIServer).

The engine shares the trainer's model object by default (`share_weights=True`), so new
weights are served as soon as the optimizer steps; with `share_weights=False` it keeps its own
copy and `update_weights` copies the trainer's state (a module or a full state dict) into it:
what asynchronous training needs (generation on version n while training produces n+1), and
what an FSDP2-sharded trainer needs (rank 0 gathers the full state dict and pushes it).

Behind the server the engine batches continuously (`HFEngine.decode_continuously`): a
request that arrives while a batch is being decoded is prefilled and joins that batch at the
next decode step, and a finished row leaves it at once. A multi-turn rollout's later turns
arrive one tool result at a time; decoded as batches of their own, one after another, they
were most of a GRPO step's generation time on CPU.

Prompts that start alike (every prompt of a tool environment starts with the same tools
block; the rollouts of a GRPO group are one prompt) are prefilled from a cached prefix: the
engine keeps the keys and values of a few shared prefixes, computed once for one row, and
prefills only what follows them. An entry is valid for the weights it was computed with: any
change to a parameter (a load, a staged update, an optimizer step on shared weights) empties
the cache.

"In flight" for this engine: a batch is decoded under the engine lock. A weight update made
while a batch is being decoded does not wait for it: the new tensors are copied aside
(`HFEngine.stage`), the batch stops taking new requests and finishes on the old weights, and
the new ones are loaded before the next batch, so requests queued meanwhile, including later
turns of multi-turn rollouts, run on them. Each result carries the policy version it was
decoded with. Nothing is aborted or re-decoded.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from sandgym.train.backends.base import Done, GenRequest, GenResult, Take, Weights, state_of
from sandgym.train.backends.openai_server import OpenAIServer
from sandgym.train.compiled import eager_layers

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

# A shared prefix shorter than this is prefilled with the rest (an entry costs a forward pass
# of its own); a few entries cover one environment's tools block and the groups in flight.
PREFIX_MIN_TOKENS = 32
PREFIX_ENTRIES = 8
KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, T, dim]


@dataclass
class _Row:
    """One request being decoded: its tokens so far."""

    req: GenRequest
    done: Done
    stops: set[int]
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    answered: bool = False  # a failure of the batch after this row finished is not its answer

    def answer(self, result: GenResult | BaseException) -> None:
        if not self.answered:
            self.answered = True
            self.done(result)


@dataclass
class _Batch:
    """Rows decoded together: left-padded, so every row's last token is in the last column."""

    rows: list[_Row]
    cache: Any  # transformers' DynamicCache: per layer, keys and values [rows, heads, T, dim]
    mask: torch.Tensor  # [rows, T]: 1 where a row has a token
    pos: torch.Tensor  # [rows, 1]: the position of each row's last token
    logits: torch.Tensor  # [rows, vocab]: for each row's next token


class HFEngine:
    """Batched sampling with a KV cache, returning token ids and raw logprobs."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any,
        device: torch.device | str | None = None,
        autocast_dtype: torch.dtype | None = None,
        max_batch_size: int = 64,
        prefix_cache: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.max_batch_size = max_batch_size
        self.prefix_cache = prefix_cache
        # Shared prefixes' keys and values (least recently used first), and the `_weights_key`
        # they were computed with.
        self._prefixes: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._prefixes_of: tuple[tuple[int, int], ...] = ()
        self._last_prompt: Sequence[int] = ()
        self.lock = threading.Lock()  # held while generating or while weights change
        self._wanted = 0  # threads waiting for `lock` through `exclusive()`: a batch stops growing
        self.continuous = continuous_batching_supported()  # else the server batches statically
        self.policy_version = 0  # of the weights served; changed under `lock`
        # Weights staged while a batch was being decoded: (state, version), loaded before the
        # next batch. Guarded by `_staged_lock` (never held while decoding).
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        self._staged_lock = threading.Lock()
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

    @property
    def vocab_size(self) -> int:
        """Ids the model accepts (its embedding rows; may exceed the tokenizer's)."""
        return int(self.model.config.vocab_size)

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        out: list[GenResult] = []
        for s in range(0, len(reqs), self.max_batch_size):
            with self.lock:
                self.apply_staged()
                res = self._generate(reqs[s : s + self.max_batch_size])
                for r in res:
                    r.policy_version = self.policy_version
                out.extend(res)
        return out

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The engine lock, taken as soon as the batch being decoded ends (it takes no new
        requests meanwhile)."""
        with self._staged_lock:
            self._wanted += 1
        try:
            with self.lock:
                yield
        finally:
            with self._staged_lock:
                self._wanted -= 1

    def _growing(self) -> bool:
        """Whether the batch being decoded may take new requests: no weights wait to be loaded
        and nobody waits for the lock."""
        with self._staged_lock:
            return self._staged is None and self._wanted == 0

    def load(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load `state` now (the caller holds `lock`); drops anything staged before."""
        with self._staged_lock:
            self._staged = None
        with torch.no_grad():
            self.model.load_state_dict(dict(state), strict=True)
        self.policy_version = version

    def stage(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Keep a copy of `state` to load before the next batch (the current one keeps
        decoding on the weights it started with)."""
        copy_ = {k: v.detach().to(self.device, copy=True) for k, v in state.items()}
        with self._staged_lock:
            self._staged = (copy_, version)

    def apply_staged(self) -> None:
        """Load the staged weights, if any (the caller holds `lock`)."""
        with self._staged_lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            with torch.no_grad():
                self.model.load_state_dict(staged[0], strict=True)
            self.policy_version = staged[1]

    @contextlib.contextmanager
    def _forward(self) -> Iterator[None]:
        """Around the model's forwards: autocast, if any, and compiled layers run eagerly
        (sandgym/train/compiled.py: decoding with a KV cache recompiles them at every new
        state of the cache)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(eager_layers())
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast_dtype))
            yield

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
            with self._forward():
                res = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = res.logits[:, -1].float()
            toks: list[torch.Tensor] = []
            lps: list[torch.Tensor] = []
            done = torch.zeros(b, dtype=torch.bool, device=dev)
            ended_by_stop = torch.zeros(b, dtype=torch.bool, device=dev)
            n_out = torch.zeros(b, dtype=torch.long, device=dev)
            for _ in range(int(max_new.max())):
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
                with self._forward():
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

    # -- continuous batching (the server's worker loop) -----------------------------------

    def decode_continuously(self, take: Take) -> None:
        """Serve requests from `take` until it says the queue closed: `take(True, n)` waits
        for the first of up to `n` requests, `take(False, n)` returns those already queued.
        Requests that arrive while a batch is decoded join it between decode steps."""
        closed = False
        while not closed:
            items, closed = take(True, self.max_batch_size)
            if not items:
                continue
            with self.lock:
                self.apply_staged()
                closed = self._decode(items, take, closed)

    def _decode(self, items: list[tuple[GenRequest, Done]], take: Take, closed: bool) -> bool:
        """Decode `items` and what joins them until every row has finished; returns whether
        the queue closed meanwhile. A failure answers every row of the batch with it."""
        model = self.model
        was_training = model.training
        model.eval()  # also keeps gradient checkpointing from disabling the cache
        batch: _Batch | None = None
        try:
            with torch.no_grad():
                while True:
                    if items:
                        batch = self._join(batch, items)
                        items = []
                    if batch is None or not batch.rows:
                        return closed
                    batch = self._step(batch)
                    room = self.max_batch_size - (len(batch.rows) if batch is not None else 0)
                    if not closed and room > 0 and self._growing():
                        items, closed = take(False, room)
        except Exception as exc:
            log.exception("generation failed")
            for row in (batch.rows if batch is not None else []):
                row.answer(exc)
            for _, done in items:
                done(exc)
            return closed
        finally:
            model.train(was_training)

    def _join(self, batch: _Batch | None, items: list[tuple[GenRequest, Done]]) -> _Batch | None:
        """Prefill `items` and add them to `batch` (a new batch when None)."""
        rows: list[_Row] = []
        for req, done in items:
            if not req.prompt_ids:
                done(ValueError("empty prompt"))
            elif req.max_tokens <= 0:
                done(GenResult(completion_ids=[], logprobs=[], finish_reason="length", policy_version=self.policy_version))
            else:
                rows.append(_Row(req, done, set(req.stop_token_ids) | (set() if req.ignore_eos else set(self.eos_ids))))
        if not rows:
            return batch
        dev = self.device
        try:
            prefix = self._shared_prefix([r.req.prompt_ids for r in rows]) if self.prefix_cache else None
            n = len(prefix[0]) if prefix is not None else 0
            cache = self._cache_of(prefix[1] if prefix is not None else [], len(rows))
            # Left padding between the prefix and each row's rest: every row's last token is at -1.
            lens = [len(r.req.prompt_ids) - n for r in rows]
            width = max(lens)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), n + width), dtype=torch.long)
            mask[:, :n] = 1
            for i, r in enumerate(rows):
                ids[i, width - lens[i] :] = torch.tensor(r.req.prompt_ids[n:], dtype=torch.long)
                mask[i, n + width - lens[i] :] = 1
            ids, mask = ids.to(dev), mask.to(dev)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, n:]
            with self._forward():
                res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        except Exception as exc:  # these rows only; the batch goes on
            log.exception("prefill failed")
            for r in rows:
                r.answer(exc)
            return batch
        new = _Batch(rows, cache, mask, pos[:, -1:], res.logits[:, -1].float())
        return new if batch is None else _merge(batch, new)

    def _weights_key(self) -> tuple[tuple[int, int], ...]:
        """Changes whenever a parameter does: in-place updates (optimizer steps, loads) bump a
        tensor's version counter; replaced tensors have another address."""
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def _shared_prefix(self, prompts: list[Sequence[int]]) -> tuple[tuple[int, ...], KV] | None:
        """The cached prefix to prefill `prompts` from, computing (or extending) one when they
        share at least PREFIX_MIN_TOKENS more than the cache holds; None when not worth it.
        A lone prompt is compared with the previous join's (a group's rollouts and a tool
        environment's prompts arrive one by one, too). Every prompt keeps one token of its own."""
        key = self._weights_key()
        if key != self._prefixes_of:
            self._prefixes.clear()
            self._prefixes_of = key
        basis = prompts if len(prompts) > 1 else [prompts[0], self._last_prompt]
        self._last_prompt = prompts[-1]
        room = min(len(p) for p in prompts) - 1
        first = prompts[0]
        shared = min(_common_prefix(first, basis), room)
        best: tuple[int, ...] = ()
        for ids in self._prefixes:
            if len(best) < len(ids) <= room and all(_starts_with(p, ids) for p in prompts):
                best = ids
        if shared >= len(best) + PREFIX_MIN_TOKENS:
            best = tuple(first[:shared])
            self._prefixes[best] = self._prefill_one(best)
            while len(self._prefixes) > PREFIX_ENTRIES:
                self._prefixes.popitem(last=False)
        if not best:
            return None
        self._prefixes.move_to_end(best)
        return best, self._prefixes[best]

    def _prefill_one(self, ids: tuple[int, ...]) -> KV:
        """Keys and values of `ids` alone, extending the longest cached prefix of it."""
        base = max((p for p in self._prefixes if len(p) < len(ids) and _starts_with(ids, p)), key=len, default=())
        cache = self._cache_of(self._prefixes[base] if base else [], 1)
        rest = torch.tensor([ids[len(base) :]], dtype=torch.long, device=self.device)
        pos = torch.arange(len(base), len(ids), device=self.device).unsqueeze(0)
        mask = torch.ones((1, len(ids)), dtype=torch.long, device=self.device)
        with self._forward():
            self.model(input_ids=rest, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return [(layer.keys, layer.values) for layer in _layers(cache)]

    def _cache_of(self, kv: KV, rows: int) -> Any:
        """A KV cache that holds `kv` (one row's) for each of `rows` rows; empty for []."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i, (k, v) in enumerate(kv):
            cache.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1), i)  # update copies
        return cache

    def _step(self, batch: _Batch) -> _Batch | None:
        """Sample each row's next token; answer the rows that finished; run the model on the
        rest. Returns the batch left (None when every row finished)."""
        rows, logits, dev = batch.rows, batch.logits, self.device
        temps = torch.tensor([max(r.req.temperature, 0.0) for r in rows], device=dev).unsqueeze(-1)
        top_p = torch.tensor([r.req.top_p for r in rows], device=dev).unsqueeze(-1)
        logp = torch.log_softmax(logits, dim=-1)
        probs = torch.softmax(logits / torch.where(temps > 0, temps, torch.ones_like(temps)), dim=-1)
        if any(r.req.top_p < 1.0 for r in rows):
            sp, si = probs.sort(dim=-1, descending=True)
            sp = sp * ((sp.cumsum(-1) - sp) < top_p)
            probs = torch.zeros_like(probs).scatter_(-1, si, sp)
            probs = probs / probs.sum(-1, keepdim=True)
        tok = torch.multinomial(probs, 1).squeeze(-1)
        tok = torch.where(temps.squeeze(-1) <= 0.0, logits.argmax(-1), tok)
        lps = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).tolist()
        keep: list[int] = []
        for i, (r, t) in enumerate(zip(rows, tok.tolist(), strict=True)):
            r.ids.append(t)
            r.lps.append(float(lps[i]))
            if t in r.stops or len(r.ids) >= r.req.max_tokens:
                r.answer(GenResult(completion_ids=r.ids, logprobs=r.lps, finish_reason="stop" if t in r.stops else "length",
                                   policy_version=self.policy_version))
            else:
                keep.append(i)
        if not keep:
            return None
        if len(keep) < len(rows):
            batch = _select(batch, keep)
            tok = tok[torch.tensor(keep, device=dev)]
        batch.mask = torch.cat([batch.mask, torch.ones((len(keep), 1), dtype=batch.mask.dtype, device=dev)], dim=-1)
        batch.pos = batch.pos + 1
        with self._forward():
            res = self.model(input_ids=tok.unsqueeze(-1), attention_mask=batch.mask, position_ids=batch.pos,
                             past_key_values=batch.cache, use_cache=True)
        batch.logits = res.logits[:, -1].float()
        return batch


def _layers(cache: Any) -> list[Any]:
    return list(cache.layers)


def _common_prefix(first: Sequence[int], others: Sequence[Sequence[int]]) -> int:
    """How many leading tokens `first` shares with every one of `others`."""
    n = len(first)
    for o in others:
        n = min(n, len(o))
        for i in range(n):
            if first[i] != o[i]:
                n = i
                break
    return n


def _starts_with(seq: Sequence[int], prefix: tuple[int, ...]) -> bool:
    return len(seq) >= len(prefix) and tuple(seq[: len(prefix)]) == prefix


def _merge(a: _Batch, b: _Batch) -> _Batch:
    """One batch of both: each left-padded to the longer, rows concatenated."""
    width = max(a.mask.shape[1], b.mask.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        short = width - t.shape[dim]
        if short == 0:
            return t
        shape = list(t.shape)
        shape[dim] = short
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    for la, lb in zip(_layers(a.cache), _layers(b.cache), strict=True):
        la.keys = torch.cat([pad(la.keys, -2), pad(lb.keys, -2)], dim=0)
        la.values = torch.cat([pad(la.values, -2), pad(lb.values, -2)], dim=0)
    return _Batch(a.rows + b.rows, a.cache, torch.cat([pad(a.mask, 1), pad(b.mask, 1)], dim=0),
                  torch.cat([a.pos, b.pos], dim=0), torch.cat([a.logits, b.logits], dim=0))


def _select(batch: _Batch, keep: list[int]) -> _Batch:
    """The rows `keep` of `batch`, without the padding columns none of them needs."""
    idx = torch.tensor(keep, device=batch.mask.device)
    mask = batch.mask.index_select(0, idx)
    first = int(mask.any(0).nonzero()[0])  # columns before it are padding in every row left
    for layer in _layers(batch.cache):
        layer.keys = layer.keys.index_select(0, idx)[..., first:, :]
        layer.values = layer.values.index_select(0, idx)[..., first:, :]
    return _Batch([batch.rows[i] for i in keep], batch.cache, mask[:, first:], batch.pos.index_select(0, idx),
                  batch.logits.index_select(0, idx))


def continuous_batching_supported() -> bool:
    """Whether this transformers keeps its KV cache as per-layer key/value tensors that
    rows can be added to and removed from (`DynamicCache.layers`, transformers 4.54+)."""
    from transformers import DynamicCache

    return hasattr(DynamicCache(), "layers")


class HFBackend:
    """The transformers backend: an HFEngine and the OpenAIServer in front of it (127.0.0.1,
    a free port unless `port` is given)."""

    name = "hf"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any,
        model_name: str = "sandgym-policy",
        share_weights: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 64,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.model_name = model_name
        self.checkpoint: str | None = None  # the checkpoint it serves, if any (serve_checkpoint)
        self.share_weights = share_weights
        served = model if share_weights else copy.deepcopy(model)
        if not share_weights:
            served.requires_grad_(False)
        self.engine = HFEngine(served, tokenizer, autocast_dtype=autocast_dtype, max_batch_size=max_batch_size)
        self.server = OpenAIServer(self.engine, model_name, host=host, port=port)
        self.weights_version = 0

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def can_update_in_flight(self) -> bool:
        # A shared model changes under the optimizer mid-decode; a copy changes only under
        # the engine lock, between batches.
        return not self.share_weights

    def start(self) -> None:
        self.server.start()

    def update_weights(self, weights: Weights, version: int | None = None) -> None:
        """Serve `weights` as `version`: at once when the engine is idle; while it decodes a
        batch, staged (copied) and loaded before the next batch, without waiting."""
        v = self.weights_version + 1 if version is None else int(version)
        if self.share_weights:
            if weights is not self.engine.model:
                # The served model is the trainer's own: anything else means its weights live
                # elsewhere (a sharded model, a state dict) and would never be served.
                raise ValueError("share_weights=True serves the trainer's model object; pass that module")
            with self.engine.exclusive():
                self.engine.policy_version = v
        elif self.engine.lock.acquire(blocking=False):
            try:
                self.engine.load(state_of(weights), v)
            finally:
                self.engine.lock.release()
        else:
            self.engine.stage(state_of(weights), v)
        self.weights_version = v

    def sleep(self) -> None:  # the engine holds no memory beyond the (shared) weights
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> HFBackend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
