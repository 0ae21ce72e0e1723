"""The trainer's rollout source on the fleet (`[env] ray_address`): groups run on the nodes,
next to their sandboxes, asking the trainer's own inference server; the token ids they bring
back train a step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import require


def test_trainer_rolls_out_on_the_fleet(cluster: Any, tmp_path: Path) -> None:
    require("torch")
    from sandgym.train.batch import states_to_sequences
    from sandgym.train.config import TrainConfig
    from sandgym.train.ray_source import RayRolloutSource
    from sandgym.train.rollout_source import RolloutSource
    from sandgym.train.trainer import Trainer, make_backend

    cfg = TrainConfig.model_validate(
        {
            "backend": {"kind": "hf"},
            "env": {"kind": "sandgym", "name": "humaneval", "args": {"num_examples": 4}, "ray_address": cluster.address},
            "rollout": {"prompts_per_step": 3, "group_size": 2, "max_tokens": 8, "temperature": 1.0},
            "optim": {"steps": 1},
            "output": {"dir": str(tmp_path / "run"), "resume": False, "plot": False},
        }
    )
    tr = Trainer(cfg)
    assert isinstance(tr.source, RayRolloutSource) and isinstance(tr.source, RolloutSource)
    tr.backend = make_backend(cfg, tr.model, tr.tokenizer, tr.device)
    tr.backend.start()
    try:
        groups, _ = tr.generate(0)
    finally:
        tr.backend.close()
    assert [len(g) for g in groups] == [2, 2, 2]
    assert [g[0].example_id for g in groups] == [0, 1, 2]  # row order kept
    states = [s for g in groups for s in g]
    for st in states:
        assert st.error is None, st.error  # a random model's answer fails the tests: reward 0, not an error
        assert st.info["fleet"]["node"] in cluster.names
        assert st.turns and st.turns[0].tokens is not None and st.turns[0].tokens.completion_ids
    tr.assign_advantages(groups)
    m = tr.policy.step(states_to_sequences(states))
    assert m["loss_tokens"] == sum(len(t.tokens.completion_ids) for s in states for t in s.turns)
