"""One or more PolicyTrainer steps on a fixed global batch, in one process or as one rank of
a torchrun job (FSDP2, gloo on CPU); rank 0 saves the metrics and the full updated weights.

    python tests/train/fsdp_step_worker.py OUT.pt LOSSES_JSON
    python -m torch.distributed.run --nproc-per-node 2 tests/train/fsdp_step_worker.py OUT.pt LOSSES_JSON

LOSSES_JSON is a list of [loss] tables; each starts again from the same initial weights.

Used by test_fsdp.py and benchmarks/fsdp_equivalence.py."""

from __future__ import annotations

import json
import random
import sys

import torch


def global_batch(seed: int = 0, n: int = 12) -> list:
    """Sequences of varied length (prompt tokens mask 0, then completion tokens mask 1),
    signed advantages, and inference logprobs near what a random model gives."""
    from sandgym.train.batch import Sequence

    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, c = rng.randint(3, 12), rng.randint(2, 30)
        ids = [rng.randrange(0, 256) for _ in range(p + c)]
        out.append(
            Sequence(
                input_ids=ids,
                loss_mask=[0] * p + [1] * c,
                inference_logprobs=[0.0] * p + [-5.6 + rng.uniform(-0.5, 0.5) for _ in range(c)],
                advantage=rng.uniform(-1.5, 1.5),
                rollout_id=f"r{i}",
            )
        )
    return out


def main(out: str, losses_json: str, steps: int = 2) -> None:
    from sandgym.models.tiny import tiny_qwen2
    from sandgym.train.config import ModelConfig, OptimConfig
    from sandgym.train.distributed import SINGLE, init
    from sandgym.train.launch import torchrun_env
    from sandgym.train.loss import LossConfig
    from sandgym.train.policy import PolicyTrainer

    torch.set_num_threads(1)
    ranks = torchrun_env()
    d = init(ranks[0], ranks[1], ranks[2], "env://", "gloo", "cpu", 300.0) if ranks else SINGLE
    results = []
    for table in json.loads(losses_json):
        loss = LossConfig.model_validate(table)
        model = tiny_qwen2(seed=0)
        ref = tiny_qwen2(seed=0).requires_grad_(False) if loss.kl_beta > 0 else None
        # 64-token micro-batches: several per rank, and not the same number on each rank.
        optim = OptimConfig(lr=1e-2, micro_batch_tokens=64, num_iterations=2, grad_clip=1.0)
        pt = PolicyTrainer(model, ModelConfig(), optim, loss, torch.device("cpu"), ref_model=ref, dist=d)
        seqs = global_batch()
        metrics = [pt.step(seqs) for _ in range(steps)]
        state = pt.full_state_dict()
        results.append({"loss": table, "metrics": metrics, "state": {k: v.detach().clone() for k, v in state.items()}})
    if d.is_main:
        torch.save({"results": results, "world_size": d.world_size}, out)
    if d.enabled:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
