"""Data-parallel training across processes with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Layout (docs/training.md): every rank holds a shard of the parameters, gradients and
optimizer state and trains on its share of each step's sequences; rank 0 also runs the
inference backend (on its GPU) and the rollout pipeline. Each step rank 0 broadcasts the
step's sequences; every rank packs its share (token-balanced, `assign_to_ranks`) and all
ranks run the same number of micro-batches (an empty one pads a rank with fewer), since every
forward and backward is a collective. Loss normalisers are computed over the whole step
(loss.StepNormalizer.from_sequences), so the per-rank loss shares add up to the one-process
loss and gradients are summed, not averaged, across ranks. After the optimizer step all ranks
gather the full state dict to rank 0's CPU (`get_model_state_dict(full_state_dict=True,
cpu_offload=True)`), which pushes it to the inference backend. Checkpoints hold full
(unsharded) state dicts, so a run can resume with another number of processes.

This module holds what a rank does (its place, collectives, sharding, full state dicts);
starting ranks is launch.py's.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


@dataclass
class Dist:
    """This process's place in the run. world_size 1 is the one-process run: every
    collective is the identity and nothing needs a process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled)."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_max(self, n: int, device: torch.device) -> int:
        if not self.enabled:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.long, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())


SINGLE = Dist()


def rank_device(device: str, dist: Dist) -> torch.device:
    """The device of this rank: `model.device`, with "auto"/"cuda" meaning this rank's GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and dist.enabled:
        return torch.device("cuda", dist.local_rank)
    return torch.device(device)


def comm_backend(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    return "nccl" if device.type == "cuda" else "gloo"


def assign_to_ranks(lengths: list[int], world_size: int) -> list[list[int]]:
    """Sequence indices per rank, balancing tokens: longest first onto the least loaded rank
    (ties to the lowest rank), each rank's list in step order. Deterministic."""
    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        out[r].append(i)
        load[r] += lengths[i]
    return [sorted(x) for x in out]


def shard_model(model: PreTrainedModel, root: torch.nn.Module) -> None:
    """FSDP2 on a transformers causal LM: each decoder layer its own unit, then `root` (the
    module whose forward the trainer calls; it owns the embeddings, final norm and the tied LM
    head). FSDP2 averages gradients over ranks; each rank's loss is its share of the step loss,
    so the trainer scales it by the world size (`loss_scale`) to get the sum. (A divide factor
    of 1 would say the same, but reduces with PREMUL_SUM, which gloo does not have.)"""
    from torch.distributed.fsdp import fully_shard

    from sandgym.train.logprobs import decoder

    for layer in decoder(model).layers:
        fully_shard(layer)
    fully_shard(root)


def loss_scale(dist: Dist) -> float:
    """What a rank's loss share is multiplied by before backward so that FSDP2's average
    over ranks is the one-process gradient."""
    return float(dist.world_size)


def init(rank: int, world_size: int, local_rank: int | None, init_method: str, backend: str, device: str, timeout_s: float) -> Dist:
    import torch.distributed as dist

    d = Dist(rank=rank, world_size=world_size, local_rank=rank if local_rank is None else local_rank)
    dev = rank_device(device, d)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(
        comm_backend(backend, dev),
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return d


def full_state_dict(model: torch.nn.Module, dist: Dist) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict: every rank takes part; rank 0 gets CPU
    tensors, other ranks an empty dict. One process: the live tensors (no copy)."""
    if not dist.enabled:
        return dict(model.state_dict())
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Full state dicts hold plain tensors (torch types the values as any kind of state).
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))


def optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer, dist: Dist) -> dict[str, Any]:
    """The optimizer state keyed by parameter name (the same on any number of processes);
    with several ranks, full tensors on rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=dist.enabled))


def load_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, Any], optim_sd: dict[str, Any] | None
) -> None:
    """Load full state dicts (what `full_state_dict` / `optimizer_state_dict` saved) into a
    plain or sharded model and its optimizer; every rank passes the whole dicts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=opts)
    if optim_sd is not None:
        set_optimizer_state_dict(model, optimizer, optim_sd, options=opts)
