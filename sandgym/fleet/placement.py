"""Placement for training on Ray: the trainer's ranks and its inference backend get GPUs
through placement groups, so they land where the layout says and nothing else takes them.

- Trainer ranks: one bundle per rank (`gpus_per_rank` GPUs each) in one placement group,
  STRICT_PACK by default (all ranks on one node: collectives stay on NVLink); a larger
  world uses PACK or SPREAD.
- Inference: one bundle per replica in a second group, so it can sit on other nodes
  (disaggregated) or fill what the trainers left (PACK).

Ranks run any torchrun-style entry point: `run_ranks` starts one `RankWorker` actor per
trainer bundle and calls `fn(*args)` in each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT set, so `torch.distributed.init_process_group()` and FSDP2 (`fully_shard`)
work as under torchrun; Ray sets CUDA_VISIBLE_DEVICES to the bundle's GPUs. That is the seam
for the trainer's FSDP2 step. Logical GPUs (`ray start --num-gpus N` on a machine without
any) are enough to check placement.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Strategy = Literal["STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"]


class TrainingLayout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trainer_ranks: int = Field(1, ge=1)
    gpus_per_rank: float = Field(1.0, ge=0)
    cpus_per_rank: float = Field(0.0, ge=0)
    trainer_strategy: Strategy = "STRICT_PACK"
    inference_replicas: int = Field(1, ge=0)
    gpus_per_replica: float = Field(1.0, ge=0)
    cpus_per_replica: float = Field(0.0, ge=0)
    inference_strategy: Strategy = "PACK"

    def trainer_bundles(self) -> list[dict[str, float]]:
        return [_bundle(self.gpus_per_rank, self.cpus_per_rank)] * self.trainer_ranks

    def inference_bundles(self) -> list[dict[str, float]]:
        return [_bundle(self.gpus_per_replica, self.cpus_per_replica)] * self.inference_replicas


def _bundle(gpus: float, cpus: float) -> dict[str, float]:
    b = {k: v for k, v in (("GPU", gpus), ("CPU", cpus)) if v > 0}
    if not b:
        raise ValueError("a bundle needs GPUs or CPUs")
    return b


class PlacementError(RuntimeError):
    """The cluster cannot hold the layout (not enough GPUs where the strategy needs them)."""


class TrainingPlacement:
    """Reserve the layout's placement groups (`reserve`), place actors in them
    (`trainer_options`, `inference_options`), give them back (`release`)."""

    def __init__(self, layout: TrainingLayout, address: str | None = None) -> None:
        self.layout = layout
        self.address = address
        self.trainers: Any = None
        self.inference: Any = None

    def reserve(self, timeout_s: float = 60.0) -> TrainingPlacement:
        from ray.util.placement_group import placement_group

        from sandgym.sandboxes.providers.ray.cluster import connect

        ray = connect(self.address)
        self.trainers = placement_group(self.layout.trainer_bundles(), strategy=self.layout.trainer_strategy, name="sandgym-trainer")
        groups = [("trainer", self.trainers)]
        if self.layout.inference_replicas:
            self.inference = placement_group(self.layout.inference_bundles(), strategy=self.layout.inference_strategy, name="sandgym-inference")
            groups.append(("inference", self.inference))
        for what, pg in groups:
            try:
                ray.get(pg.ready(), timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                have = ray.cluster_resources().get("GPU", 0)
                self.release()
                raise PlacementError(
                    f"the {what} placement group ({pg.bundle_specs}, {self.layout.model_dump()}) did not fit within "
                    f"{timeout_s:.0f}s; the cluster has {have:g} GPUs in all"
                ) from None
        return self

    def _options(self, pg: Any, index: int, gpus: float, cpus: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if pg is None:
            raise RuntimeError("reserve() first")
        return {
            "num_gpus": gpus,
            "num_cpus": cpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
        }

    def trainer_options(self, rank: int) -> dict[str, Any]:
        """`.options(**...)` for the actor of trainer rank `rank`."""
        return self._options(self.trainers, rank, self.layout.gpus_per_rank, self.layout.cpus_per_rank)

    def inference_options(self, replica: int = 0) -> dict[str, Any]:
        """`.options(**...)` for the actor serving inference replica `replica`."""
        return self._options(self.inference, replica, self.layout.gpus_per_replica, self.layout.cpus_per_replica)

    def where(self) -> dict[str, list[str]]:
        """The Ray node id of each bundle: {"trainer": [...], "inference": [...]}."""
        from ray.util.placement_group import placement_group_table

        out: dict[str, list[str]] = {}
        for what, pg in (("trainer", self.trainers), ("inference", self.inference)):
            if pg is not None:
                table = placement_group_table(pg)["bundles_to_node_id"]
                out[what] = [table[i] for i in sorted(table)]
        return out

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in (self.trainers, self.inference):
            if pg is not None:
                remove_placement_group(pg)
        self.trainers = self.inference = None

    def __enter__(self) -> TrainingPlacement:
        return self.reserve()

    def __exit__(self, *exc: object) -> None:
        self.release()


class RankWorker:
    """One trainer rank (Ray actor class; wrapped by `run_ranks`)."""

    def endpoint(self) -> tuple[str, int]:
        """An address the ranks rendezvous at: this node's loopback or routable address
        and a free port (asked of rank 0 only)."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, int(s.getsockname()[1])

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def run(self, fn: Callable[..., Any], rank: int, world: int, master: tuple[str, int], args: Sequence[Any]) -> Any:
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=master[0], MASTER_PORT=str(master[1]),
        )
        return fn(*args)


def run_ranks(placement: TrainingPlacement, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
    """Start one rank per trainer bundle and run `fn(*args)` in each, torchrun-style;
    returns the ranks' results in rank order. The actors end when this returns."""
    import ray

    from sandgym.sandboxes.providers.ray.fleet import agent_runtime_env

    world = placement.layout.trainer_ranks
    cls = ray.remote(RankWorker)
    # Any: Ray types an actor's methods as the plain methods, without their `.remote`.
    workers: list[Any] = [cls.options(**placement.trainer_options(r), runtime_env=agent_runtime_env()).remote() for r in range(world)]
    try:
        master = ray.get(workers[0].endpoint.remote(), timeout=timeout_s)
        return list(ray.get([w.run.remote(fn, r, world, master, list(args)) for r, w in enumerate(workers)], timeout=timeout_s))
    finally:
        for w in workers:
            ray.kill(w)
