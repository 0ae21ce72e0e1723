"""Asynchronous off-policy training on CPU with the built-in transformers backend.

- Weights pushed while a request is being decoded: the push does not wait; the batch in
  progress finishes on the old weights (and says so), the next request runs on the new weights
  and says so.
- The trainer with optim.async_level = 1: one group is held back by its source until the
  trainer has pushed two newer versions, so it is too old when it arrives
  (max_off_policy_steps = 1): dropped, counted, and replaced; every group trained on is at
  most 1 version old, and generation ran ahead (some groups 1 version old).
- DAPO's dynamic sampling: groups whose rewards do not vary (sampled greedily, so all members
  are equal) are dropped and more are generated, up to max_groups_factor.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import openai
import torch

from sandgym.core.state import State
from sandgym.models.tiny import byte_tokenizer, tiny_qwen2
from sandgym.train.backends.hf import HFBackend
from sandgym.train.config import TrainConfig
from sandgym.train.trainer import Trainer


def _cfg(tmp: Path, **over: dict) -> TrainConfig:
    data: dict[str, Any] = {
        "backend": {"kind": "hf"},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_tokens": 6},
        "optim": {"steps": 4, "lr": 1e-2, "micro_batch_tokens": 2048, "seed": 0},
        "output": {"dir": str(tmp), "resume": False, "plot": False},
    }
    for k, v in over.items():
        data.setdefault(k, {}).update(v)
    return TrainConfig.model_validate(data)


def test_weights_pushed_under_a_request_in_flight() -> None:
    model = tiny_qwen2(seed=3)
    b = HFBackend(model, byte_tokenizer(), share_weights=False)
    assert b.can_update_in_flight
    b.start()
    try:
        client = openai.OpenAI(base_url=b.base_url, api_key="x")
        long: dict[str, Any] = {}

        def generate() -> None:
            long["r"] = client.completions.create(
                model=b.model_name, prompt=[1, 2, 3], max_tokens=60, temperature=0.0, logprobs=1, extra_body={"ignore_eos": True}
            )

        t = threading.Thread(target=generate)
        t.start()
        while not b.engine.lock.locked():  # the request is being decoded
            time.sleep(0.001)
        with torch.no_grad():
            model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
        b.update_weights(model, version=7)  # staged: the batch in progress keeps its weights
        assert t.is_alive() and b.engine.lock.locked()  # returned while the request decodes
        t.join()
        first = long["r"].choices[0]
        assert first.model_extra["policy_version"] == 0
        assert len(first.model_extra["token_ids"]) == 60  # decoded to the end, not aborted
        after = client.completions.create(
            model=b.model_name, prompt=[1, 2, 3], max_tokens=1, temperature=0.0, logprobs=1, extra_body={"ignore_eos": True}
        )
        assert after.choices[0].model_extra["policy_version"] == 7
        # The same prompt on the new weights: another distribution.
        assert after.choices[0].logprobs.token_logprobs[0] != first.logprobs.token_logprobs[0]
        assert b.weights_version == 7 and torch.equal(b.engine.model.lm_head.weight, model.lm_head.weight)
    finally:
        b.close()


class HoldRow:
    """The trainer's source, except that the group of row `row` is returned only once the
    backend serves version `until` (its rollouts were generated on the older weights)."""

    def __init__(self, inner: Any, backend: Any, row: int, until: int) -> None:
        self.inner, self.backend, self.row, self.until, self.name = inner, backend, row, until, inner.name
        self.held: list[State] = []

    async def generate_groups(self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict, max_concurrent: int) -> list[list[State]]:
        groups = await self.inner.generate_groups(base_url, model, start, count, group_size, sampling, max_concurrent)
        if start == self.row:
            self.held = groups[0]
            while self.backend.weights_version < self.until:
                await anyio.sleep(0.02)
        return groups

    def sandbox_session(self) -> AbstractAsyncContextManager[None]:
        return self.inner.sandbox_session()


def test_async_runs_ahead_and_drops_stale_groups(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, optim={"async_level": 1, "max_off_policy_steps": 1})
    tr = Trainer(cfg)
    assert tr.backend is not None and tr.backend.can_update_in_flight  # a copy is served
    src = tr.source = HoldRow(tr.source, tr.backend, row=1, until=2)
    hist = tr.run()
    assert [int(m["step"]) for m in hist] == [1, 2, 3, 4]
    assert all(m["groups_kept"] == 2 for m in hist)
    # The held group was generated on version 0 and arrived when version 2 was trained.
    versions = {t.tokens.policy_version for s in src.held for t in s.turns}
    assert versions == {0}
    assert sum(m["stale_groups_dropped"] for m in hist) == 1
    assert sum(m["stale_rollouts_dropped"] for m in hist) == 4
    assert sum(m["refill_groups"] for m in hist) == 1  # replaced
    assert all(m["staleness_max"] <= 1 for m in hist)
    assert any(m["staleness"] > 0 for m in hist)  # generation ran ahead of training
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["stale_groups_dropped"] == hist[-1]["stale_groups_dropped"]


class GreedyEvenRows:
    """The trainer's source with even rows sampled greedily: all members of such a group
    are the same rollout, so its rewards do not vary."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name

    async def generate_groups(self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict, max_concurrent: int) -> list[list[State]]:
        if start % 2 == 0:
            sampling = {**sampling, "temperature": 0.0}
        return await self.inner.generate_groups(base_url, model, start, count, group_size, sampling, max_concurrent)

    def sandbox_session(self) -> AbstractAsyncContextManager[None]:
        return self.inner.sandbox_session()


def test_dynamic_sampling_drops_zero_variance_groups_and_refills(tmp_path: Path) -> None:
    def collect(**rollout: Any) -> tuple[list[int], dict[str, float]]:
        # 24 sampled tokens per member: four members tie on the reward (a fraction of the
        # tokens in a range) about 1% of the time, so odd rows nearly always carry signal.
        tr = Trainer(_cfg(tmp_path, rollout={"prompts_per_step": 3, "max_tokens": 24, **rollout}))
        tr.source = GreedyEvenRows(tr.source)
        with tr.generation():
            groups, m = tr.collect()
        for g in groups:
            rewards = [s.reward for s in g.states]
            if max(rewards) == min(rewards):
                assert all(s.advantage == 0.0 for s in g.states)  # kept, but teaches nothing
        return [g.row for g in groups], m

    rows, m = collect()
    assert rows == [0, 1, 2] and m["no_signal_groups"] >= 2 and m["refill_groups"] == 0

    # Room for 15 groups (8 even, 7 odd): three odd ones with signal are all but certain.
    rows, m = collect(dynamic_sampling=True, max_groups_factor=5.0)
    assert len(rows) == 3 and all(r % 2 == 1 for r in rows), rows
    assert m["no_signal_groups"] >= 3 and m["refill_groups"] >= 3
    assert m["groups_examined"] == 3 + m["no_signal_groups"]

    # Bounded: at most max_groups_factor x prompts_per_step groups are examined.
    rows, m = collect(dynamic_sampling=True, max_groups_factor=1.0)
    assert set(rows) <= {1} and m["groups_examined"] == 3 and m["refill_groups"] == 0
