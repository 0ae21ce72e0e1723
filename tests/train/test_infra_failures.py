"""Infrastructure failures are not rewards. A real HTTP proxy in front of the trainer's
inference server answers some second-turn requests with 500 (every retry of them too), so
those rollouts fail mid-rollout as model failures (State.error_kind = "model"). The trainer
masks them out of the loss: its update equals the update computed with the failed rollouts
removed before advantages were computed (zero gradient from them; group advantages over the
valid members only), and differs from the old behaviour (a failure scored 0 and trained on);
the step's metrics report the infra-failure rate."""

from __future__ import annotations

import copy
import http.server
import threading
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import torch

from sandgym.core.state import State
from sandgym.core.stats import group_advantages
from sandgym.train.batch import states_to_sequences
from sandgym.train.config import TrainConfig
from sandgym.train.policy import PolicyTrainer
from sandgym.train.trainer import Trainer

PROMPT_LEN = 8


class FailingProxy:
    """Forwards /v1/* to `upstream`; a completion request past the first turn whose body
    hashes to 0 mod 3 gets HTTP 500 instead (the same body, so every retry fails too)."""

    def __init__(self) -> None:
        self.upstream = ""
        self.failed_requests = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                import json

                prompt = json.loads(body).get("prompt") or []
                if isinstance(prompt, list) and len(prompt) > PROMPT_LEN and zlib.crc32(body) % 3 == 0:
                    proxy.failed_requests += 1
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "injected server error"}}')
                    return
                req = urllib.request.Request(proxy.upstream.removesuffix("/v1") + self.path, data=body, headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ThroughProxy:
    """The trainer's rollout source, talking to the model server through the proxy."""

    def __init__(self, inner: Any, proxy: FailingProxy) -> None:
        self.inner, self.proxy, self.name = inner, proxy, inner.name

    async def generate_groups(self, base_url: str, model: str, start: int, count: int, group_size: int, sampling: dict, max_concurrent: int) -> list[list[State]]:
        self.proxy.upstream = base_url
        return await self.inner.generate_groups(self.proxy.url, model, start, count, group_size, sampling, max_concurrent)

    def sandbox_session(self) -> AbstractAsyncContextManager[None]:
        return self.inner.sandbox_session()


@pytest.fixture
def proxy() -> Iterator[FailingProxy]:
    p = FailingProxy()
    yield p
    p.close()


def _cfg(tmp: Path) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "backend": {"kind": "hf"},
            "env": {"toy": {"prompt_len": PROMPT_LEN, "turns": 2}},
            "rollout": {"prompts_per_step": 4, "group_size": 6, "max_tokens": 6},
            "optim": {"steps": 2, "lr": 1e-2, "seed": 0},
            "output": {"dir": str(tmp), "resume": False, "plot": False},
        }
    )


def _step_weights(tr: Trainer, init: dict[str, torch.Tensor], seqs: list) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(tr.model)
    model.load_state_dict(init)
    pt = PolicyTrainer(model, tr.cfg.model, tr.cfg.optim, tr.cfg.loss, tr.device)
    pt.step(seqs)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_failed_rollouts_are_masked_out_of_the_loss(tmp_path: Path, proxy: FailingProxy) -> None:
    tr = Trainer(_cfg(tmp_path))
    tr.source = ThroughProxy(tr.source, proxy)
    init = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    with tr.generation():
        groups, m = tr.collect()
        step_metrics = tr.train_step()  # a whole step through the same proxy: its metrics
    states = [s for g in groups for s in g.states]
    failed = [s for s in states if s.failed]
    assert proxy.failed_requests > 0 and failed, "the proxy injected no failure"
    assert all(s.error_kind == "model" and "500" in (s.error or "") for s in failed), [s.error for s in failed]
    # Failed mid-rollout: the first turn came back (it has tokens), the second did not.
    assert all(len(s.turns) == 1 and s.turns[0].tokens is not None for s in failed)
    mixed = [g for g in groups if any(s.failed for s in g.states) and sum(not s.failed for s in g.states) >= 2]
    assert mixed, "no group with both failed and valid members"

    # Advantages over the valid members only; failed members get none of the signal.
    for g in groups:
        ok = [s for s in g.states if not s.failed]
        want = group_advantages([s.reward for s in ok])
        assert [s.advantage for s in ok] == pytest.approx(want)
        assert all(s.advantage == 0.0 for s in g.states if s.failed)

    # No sequence for a failed rollout: its tokens are not in the loss.
    seqs, _ = tr.sequences(states)
    assert {q.rollout_id for q in seqs} == {s.id for s in states if not s.failed}

    # The update equals the one computed as if the failed rollouts had never existed.
    clean_groups = []
    for g in groups:
        ok = [s.model_copy(deep=True) for s in g.states if not s.failed]
        for s, a in zip(ok, group_advantages([s.reward for s in ok])):
            s.advantage = a
        clean_groups.append(ok)
    clean = states_to_sequences([s for g in clean_groups for s in g])
    w_masked = _step_weights(tr, init, seqs)
    w_clean = _step_weights(tr, init, clean)
    for k in w_masked:
        assert torch.equal(w_masked[k], w_clean[k]), k

    # The old behaviour (a failure is reward 0, trained on) gives another update.
    naive = []
    for g in groups:
        members = [s.model_copy(deep=True) for s in g.states]
        for s in members:
            if s.failed:
                s.reward = 0.0
        for s, a in zip(members, group_advantages([s.reward for s in members])):
            s.advantage, s.error = a, None
        naive.extend(members)
    w_naive = _step_weights(tr, init, states_to_sequences(naive))
    assert any(not torch.equal(w_masked[k], w_naive[k]) for k in w_masked)

    # The step's metrics report the failures.
    assert m["failed_model"] == len(failed) and m["rollouts"] == len(states)
    assert m["infra_failure_rate"] == pytest.approx(len(failed) / len(states))
    assert step_metrics["infra_failure_rate"] > 0 and step_metrics["rollout_errors"] == step_metrics["failed_model"]
    assert step_metrics["loss_tokens"] > 0
