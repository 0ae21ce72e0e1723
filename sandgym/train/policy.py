"""The optimisation half of GRPO: packed sequences in, one optimizer step out.

Kept apart from the loop (trainer.py) so the benchmark and tests can drive a step on a fixed
batch. Attention runs through sandgym's varlen implementation (attention.py) and logprobs in
chunks (logprobs.py), inside `LogprobModel.forward`, so that with FSDP2 (distributed.py) the
root unit's parameters (embeddings, final norm, tied LM head) are gathered around it.

With several processes each rank gets the whole step's sequences, trains on its share
(distributed.assign_to_ranks) and all ranks add up to the one-process step: same normalisers,
gradients summed across ranks, metrics summed across ranks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from sandgym.train.attention import pick_kernel, takes_shared_prefix, use_varlen
from sandgym.train.batch import MicroBatch, Sequence, pack
from sandgym.train.compiled import compile_layers
from sandgym.train.config import LossConfig, ModelConfig, OptimConfig
from sandgym.train.distributed import (
    SINGLE,
    Dist,
    assign_to_ranks,
    full_state_dict,
    load_state,
    loss_scale,
    optimizer_state_dict,
    shard_model,
)
from sandgym.train.logprobs import packed_logprobs, pick_head_kernel
from sandgym.train.loss import StepNormalizer, grpo_loss

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(model_cfg: ModelConfig, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA (float32 master weights for AdamW); none on CPU by default."""
    if model_cfg.dtype == "bfloat16" or (model_cfg.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """Autocast to `dtype` (autocast_dtype's answer) on `device`; nothing when it is None."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


class LogprobModel(torch.nn.Module):
    """A causal LM whose forward is: packed micro-batch -> (token logprobs, entropy or None)."""

    def __init__(self, model: PreTrainedModel, kernel: str, chunk_size: int, head_kernel: str = "torch") -> None:
        super().__init__()
        self.model = model
        self.kernel = kernel
        self.chunk_size = chunk_size
        self.head_kernel = head_kernel

    def forward(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        return packed_logprobs(
            self.model,
            mb.input_ids,
            mb.position_ids,
            mb.cu_seqlens,
            mb.max_seqlen,
            mb.targets,
            kernel=self.kernel,
            chunk_size=self.chunk_size,
            only=mb.mask > 0,  # project only trained positions
            head_kernel=self.head_kernel,
            prefix_len=mb.prefix_len,
        )


def empty_micro_batch(pad_id: int = 0) -> MicroBatch:
    """One token, nothing trained: what a rank with fewer micro-batches runs so that every
    rank takes part in every FSDP collective."""
    z = torch.zeros(1)
    return MicroBatch(
        input_ids=torch.tensor([[pad_id]]),
        position_ids=torch.zeros((1, 1), dtype=torch.long),
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
        max_seqlen=1,
        targets=torch.zeros(1, dtype=torch.long),
        mask=z,
        advantages=z.clone(),
        inference_logprobs=z.clone(),
        seq_index=torch.zeros(1, dtype=torch.long),
    )



def lr_lambda(warmup_steps: int, total_steps: int, schedule: str) -> Callable[[int], float]:
    """The learning-rate factor of optimizer step `s` (0-based): a linear warmup over
    `warmup_steps`, then constant, or decaying linearly or along a cosine to 0 at
    `total_steps` (a run then ends on small steps instead of wherever its last big one left it)."""

    def factor(s: int) -> float:
        if warmup_steps > 0 and s < warmup_steps:
            return (s + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return factor

class PolicyTrainer:
    def __init__(
        self,
        model: PreTrainedModel,
        model_cfg: ModelConfig,
        optim_cfg: OptimConfig,
        loss_cfg: LossConfig,
        device: torch.device,
        ref_model: PreTrainedModel | None = None,
        dist: Dist = SINGLE,
    ) -> None:
        self.model = model
        self.model_cfg = model_cfg
        self.optim_cfg = optim_cfg
        self.loss_cfg = loss_cfg
        self.device = device
        self.ref_model = ref_model
        self.dist = dist
        self.kernel = pick_kernel(device, model_cfg.attention)
        self.share_prefix = model_cfg.share_prefix and takes_shared_prefix(self.kernel)
        use_varlen(model)
        if ref_model is not None:
            use_varlen(ref_model)
        self.head_kernel = pick_head_kernel(device, model_cfg.logprob_kernel)
        log.info("attention kernel: %s, logprob kernel: %s (device %s)", self.kernel, self.head_kernel, device)
        if model_cfg.gradient_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if model_cfg.compile_layers:
            compile_layers(model)
            if ref_model is not None:
                compile_layers(ref_model)
        self.amp_dtype = autocast_dtype(model_cfg, device)
        self.lp_model = LogprobModel(model, self.kernel, model_cfg.logprob_chunk_size, self.head_kernel)
        self.ref_lp_model = (
            LogprobModel(ref_model, self.kernel, model_cfg.logprob_chunk_size, self.head_kernel) if ref_model is not None else None
        )
        if dist.enabled:
            shard_model(model, self.lp_model)
            if ref_model is not None and self.ref_lp_model is not None:
                shard_model(ref_model, self.ref_lp_model)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optim_cfg.lr,
            betas=optim_cfg.betas,
            eps=optim_cfg.eps,
            weight_decay=optim_cfg.weight_decay,
            fused=device.type == "cuda",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(optim_cfg.warmup_steps, optim_cfg.steps, optim_cfg.schedule)
        )
        pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0

    # ---- state ---------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full model weights (a collective with several ranks; rank 0 gets them)."""
        return full_state_dict(self.model, self.dist)

    def optimizer_state_dict(self) -> dict[str, Any]:
        return optimizer_state_dict(self.model, self.optimizer, self.dist)

    def load_state(self, model_sd: dict[str, torch.Tensor], optim_sd: dict[str, Any] | None) -> None:
        load_state(self.model, self.optimizer, model_sd, optim_sd)

    # ---- step ----------------------------------------------------------------------------

    def _logprobs(self, model: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        with autocast(self.device, self.amp_dtype):
            return model(mb)

    def local_micro_batches(self, seqs: list[Sequence]) -> list[MicroBatch]:
        """This rank's packed share of the step, sequence indices global, padded with empty
        micro-batches to the largest count on any rank."""
        mine = assign_to_ranks([len(s) for s in seqs], self.dist.world_size)[self.dist.rank]
        mbs = pack([seqs[i] for i in mine], self.optim_cfg.micro_batch_tokens, share_prefix=self.share_prefix) if mine else []
        ids = torch.tensor(mine, dtype=torch.long)
        for mb in mbs:
            mb.seq_index = ids[mb.seq_index]
            mb.seq_indices = [mine[i] for i in mb.seq_indices]
        n = self.dist.all_max(len(mbs), self.device)
        mbs += [empty_micro_batch(self.pad_id) for _ in range(n - len(mbs))]
        return [mb.to(self.device) for mb in mbs]

    def step(self, seqs: list[Sequence]) -> dict[str, float]:
        """One generation batch -> `num_iterations` optimizer steps (accumulating over packed
        micro-batches). `seqs` is the whole step (every rank passes the same list). Returns
        metrics of the last pass, summed over ranks."""
        if not seqs:
            raise ValueError("no trainable sequences in this batch")
        t0 = time.perf_counter()
        self.lp_model.train()
        mbs = self.local_micro_batches(seqs)
        norm = StepNormalizer.from_sequences(seqs)
        use_inf = all(s.has_inference_logprobs for s in seqs)
        iters = self.optim_cfg.num_iterations
        scale = loss_scale(self.dist)
        # The pre-update logprobs of the off-policy passes are the first pass's own: the
        # optimizer steps only after every micro-batch of a pass (no separate forward pass).
        old: list[torch.Tensor | None] = [None] * len(mbs)
        ref: list[torch.Tensor | None] = [None] * len(mbs)
        if self.ref_lp_model is not None and self.loss_cfg.kl_beta > 0:
            with torch.no_grad():
                for i, mb in enumerate(mbs):
                    ref[i] = self._logprobs(self.ref_lp_model, mb)[0].detach()
        sums: dict[str, torch.Tensor] = {}
        grad_norm: Any = torch.zeros(())
        for _ in range(iters):
            # Metric sums stay on the device until the end: no host sync per micro-batch.
            sums = {}
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                lp, ent = self._logprobs(self.lp_model, mb)
                prev = old[i]
                old_lp = prev if prev is not None else lp.detach()
                if prev is None and iters > 1:
                    old[i] = old_lp
                loss, stats = grpo_loss(
                    lp,
                    old_lp,
                    mb.advantages,
                    mb.mask,
                    mb.seq_index,
                    norm,
                    self.loss_cfg,
                    inference_logprobs=mb.inference_logprobs if use_inf else None,
                    ref_logprobs=ref[i],
                )
                (loss * scale).backward() if scale != 1.0 else loss.backward()
                m = mb.mask
                stats["loss"] = loss.detach()
                if ent is not None:  # the "liger" kernel computes none
                    stats["entropy_sum"] = (ent * m).sum()
                stats["train_tokens"] = torch.tensor(float(mb.num_tokens) if mb.seq_indices else 0.0)  # padding: 0
                if use_inf:
                    stats["inf_diff_sum"] = ((old_lp.detach() - mb.inference_logprobs).abs() * m).sum()
                for k, v in stats.items():
                    v = v.detach().double().to(self.device)
                    sums[k] = sums[k] + v if k in sums else v
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
            self.optimizer.step()
        self.scheduler.step()
        keys = sorted(sums)
        total = self.dist.all_reduce_sum(torch.stack([sums[k] for k in keys]))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        host = dict(zip(keys, total.cpu().tolist(), strict=True))  # one sync for all metrics
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2: the global norm
            grad_norm = grad_norm.full_tensor()
        gn = float(grad_norm)
        tokens = max(host["tokens"], 1.0)
        ntok = host["train_tokens"]
        out = {
            "loss": host["loss"],
            "clip_frac": host["clip_sum"] / tokens,
            "ratio_mean": host["ratio_sum"] / tokens,
            "grad_norm": gn if math.isfinite(gn) else float("nan"),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "train_tokens": ntok,
            "loss_tokens": host["tokens"],
            "micro_batches": float(len(mbs)),
            "train_s": dt,
            "train_tokens_per_s": ntok / dt if dt > 0 else 0.0,
        }
        if "entropy_sum" in host:
            out["entropy"] = host["entropy_sum"] / tokens
        if self.loss_cfg.kl_beta > 0:
            out["kl"] = host["kl_sum"] / tokens
        if use_inf:
            out["inference_logprob_abs_diff"] = host["inf_diff_sum"] / tokens
        if "mismatch_kl_sum" in host:
            out["mismatch_kl"] = host["mismatch_kl_sum"] / tokens
        if "is_weight_sum" in host:
            out["is_weight_mean"] = host["is_weight_sum"] / tokens
            out["is_masked_frac"] = host["is_masked_sum"] / tokens
        return out
