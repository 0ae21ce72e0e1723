"""Placement for training on the simulated cluster (2 logical GPUs per node): the trainer's
ranks packed on one node with their own GPUs, the inference backend on GPUs they do not
hold, a layout that cannot fit refused with a clear error, and the ranks running an FSDP2
(`fully_shard`) step together, torchrun-style, on CPU with gloo."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.conftest import require


def fsdp2_step(seed: int) -> dict[str, Any]:
    """One FSDP2 training step of the tiny model; runs in each rank."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from sandgym.models.tiny import tiny_qwen2

    dist.init_process_group("gloo")
    try:
        model = tiny_qwen2(seed=seed)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        torch.manual_seed(seed + dist.get_rank())  # each rank its own micro-batch
        ids = torch.randint(0, 200, (2, 12))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        # After the step every rank holds the same full weights (gathered from the shards).
        full = sum(float(p.full_tensor().double().sum()) for p in model.parameters())
        sharded = type(next(model.parameters())).__name__
        return {"rank": dist.get_rank(), "world": dist.get_world_size(), "loss": float(loss.detach()), "checksum": full, "param_type": sharded}
    finally:
        dist.destroy_process_group()


def test_trainer_and_inference_are_placed_apart(cluster: Any) -> None:
    import ray

    from sandgym.fleet.placement import RankWorker, TrainingLayout, TrainingPlacement

    free_gpus = ray.available_resources().get("GPU", 0)
    layout = TrainingLayout(trainer_ranks=2, gpus_per_rank=1, inference_replicas=1, gpus_per_replica=1)
    with TrainingPlacement(layout, cluster.address) as placement:
        where = placement.where()
        assert len(set(where["trainer"])) == 1  # STRICT_PACK: both ranks on one node
        probe = ray.remote(RankWorker)
        ranks = [probe.options(**placement.trainer_options(r)).remote() for r in range(2)]
        server = probe.options(**placement.inference_options(0)).remote()
        seen = ray.get([a.where.remote() for a in ranks + [server]], timeout=120)
        r0, r1, inf = seen
        assert r0["node_id"] == r1["node_id"] == where["trainer"][0]
        assert len(r0["gpu_ids"]) == len(r1["gpu_ids"]) == 1 and r0["gpu_ids"] != r1["gpu_ids"]
        assert inf["node_id"] == where["inference"][0]
        used = {(r["node_id"], g) for r in (r0, r1) for g in r["gpu_ids"]}
        assert not used & {(inf["node_id"], g) for g in inf["gpu_ids"]}  # no GPU shared
        assert r0["cuda_visible_devices"] == r0["gpu_ids"][0]  # what the rank's CUDA would see
        assert ray.available_resources().get("GPU", 0) <= free_gpus - 3
        for a in ranks + [server]:
            ray.kill(a)
    # released: the GPUs are free again (Ray frees them asynchronously)
    import time

    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < free_gpus and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("GPU", 0) == free_gpus


def test_a_layout_that_cannot_fit_is_refused(cluster: Any) -> None:
    from sandgym.fleet.placement import PlacementError, TrainingLayout, TrainingPlacement

    # Three ranks on one node, but a node has two GPUs.
    with pytest.raises(PlacementError, match="did not fit"):
        TrainingPlacement(TrainingLayout(trainer_ranks=3, inference_replicas=0), cluster.address).reserve(timeout_s=3)


def test_ranks_run_an_fsdp2_step_together(cluster: Any) -> None:
    require("torch")
    import ray.cloudpickle

    from sandgym.fleet.placement import TrainingLayout, TrainingPlacement, run_ranks

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    layout = TrainingLayout(trainer_ranks=2, gpus_per_rank=1, inference_replicas=0)
    with TrainingPlacement(layout, cluster.address) as placement:
        results = run_ranks(placement, fsdp2_step, 0, timeout_s=300)
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    assert {r["param_type"] for r in results} == {"DTensor"}  # sharded by fully_shard
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"])  # one model, in step
    assert results[0]["loss"] != results[1]["loss"]  # each rank trained on its own batch
