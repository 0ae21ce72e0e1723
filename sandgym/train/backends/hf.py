"""The built-in transformers inference backend: HFEngine (batched sampling with a KV cache)
behind an OpenAI-compatible server on 127.0.0.1 (openai_server.OpenAIServer).

The engine shares the trainer's model object by default (`share_weights=True`), so new
weights are served as soon as the optimizer steps; with `share_weights=False` it keeps its own
copy and `update_weights` copies the trainer's state (a module or a full state dict) into it:
what asynchronous training needs (generation on version n while training produces n+1), and
what an FSDP2-sharded trainer needs (rank 0 gathers the full state dict and pushes it).

"In flight" for this engine: one `generate` call decodes a batch of requests to the end
under the engine lock. A weight update made while a batch is being decoded does not wait for
it: the new tensors are copied aside (`HFEngine.stage`) and loaded under the lock before the
next batch, so the batch in progress finishes on the old weights and requests queued
meanwhile, including later turns of multi-turn rollouts, run on the new ones. Each result
carries the policy version it was decoded with. Nothing is aborted or re-decoded.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from sandgym.train.backends.base import GenRequest, GenResult, Weights, state_of
from sandgym.train.backends.openai_server import OpenAIServer

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class HFEngine:
    """Batched sampling with a KV cache, returning token ids and raw logprobs."""

    def __init__(
        self,
        model: PreTrainedModel,
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
            with self.engine.lock:
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
