"""Starting the ranks of a training run (distributed.py is what each rank does):
`train_rank(cfg, rank, world_size, ...)` runs one rank (under torchrun, or a Ray actor that
places ranks itself); `launch(cfg, nproc)` starts `nproc` local ranks (`sandgym train --nproc
N`); `torchrun_env()` reads the rank torchrun gave this process.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from sandgym.train.config import TrainConfig

# torch, the process group and the trainer are imported by the functions that run ranks:
# `sandgym train` reads torchrun's environment and refuses a bad config before any of them.


def train_rank(
    cfg: TrainConfig,
    rank: int,
    world_size: int,
    local_rank: int | None = None,
    init_method: str = "env://",
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Run rank `rank` of a `world_size`-process training run (the function torchrun's
    `sandgym train`, `launch` and a Ray placement call). `on_step` is called on rank 0 only.
    Returns the metrics history on rank 0, [] elsewhere."""
    import torch.distributed as dist

    from sandgym.train.distributed import init
    from sandgym.train.trainer import Trainer

    cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"nproc": world_size})})
    d = init(rank, world_size, local_rank, init_method, cfg.distributed.backend, cfg.model.device, cfg.distributed.timeout_s)
    try:
        trainer = Trainer(cfg, on_step=on_step if d.is_main else None, dist=d)
        hist = trainer.run()
        return hist if d.is_main else []
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(local_rank: int, cfg_json: str, nproc: int, init_method: str, on_step: Callable[[dict[str, float]], None] | None, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    cfg = TrainConfig.model_validate_json(cfg_json)
    train_rank(cfg, local_rank, nproc, local_rank=local_rank, init_method=init_method, on_step=on_step)


def launch(cfg: TrainConfig, nproc: int, on_step: Callable[[dict[str, float]], None] | None = None) -> None:
    """Start `nproc` ranks on this machine (spawned processes, a rendezvous on 127.0.0.1) and
    wait for them. `on_step` must be picklable (a module-level function); rank 0 calls it.
    CPU threads are split between the ranks."""
    import torch
    import torch.multiprocessing as mp

    threads = max(1, (os.cpu_count() or 1) // nproc) if not torch.cuda.is_available() else torch.get_num_threads()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    cfg_json = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"nproc": nproc})}).model_dump_json()
    mp.start_processes(_worker, args=(cfg_json, nproc, init_method, on_step, threads), nprocs=nproc, start_method="spawn", join=True)


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when started by torchrun with more than one process."""
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    if ws <= 1:
        return None
    return int(os.environ["RANK"]), ws, int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
