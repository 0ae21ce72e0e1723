"""Token-in multi-turn through the trainer's own backend (OpenAIServer in front of the HF engine)
with tiny models taught by `sandgym sft`'s trainer to end their turns:

- a byte tokenizer whose decode -> encode does not round-trip the model's tokens (bytes that
  are not UTF-8, special tokens in the middle of text): message-in rollouts break the prefix
  property (today's `on_prefix_mismatch = "skip"` case); token-in rollouts train whole, none
  skipped, and the trainer's logprobs equal the server's;
- a Qwen3-style template that drops earlier turns' `<think>` reasoning when it re-renders the
  chat: with token-in each training sequence is exactly what the model saw at every turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandgym.core.state import State, Turn
from sandgym.train.batch import PrefixMismatchError, state_to_sequence
from sandgym.train.config import TrainConfig
from sandgym.train.sft import SFTConfig, SFTTrainer
from sandgym.train.trainer import Trainer, make_backend

ECHO_ENV = '''
from sandgym.core.environment import MultiTurnEnv
from sandgym.core.rubric import Rubric


def length_parity(completion) -> float:
    return float(sum(len(str(m.get("content") or "")) for m in completion) % 2)


class EchoEnv(MultiTurnEnv):
    """The user answers every assistant turn with the same short message."""

    async def env_response(self, messages, state):
        return [{"role": "user", "content": "encore ü"}]


def load_environment(max_turns=3, **kw):
    rows = [{"question": f"salut {i} é", "answer": ""} for i in range(8)]
    return EchoEnv(dataset=rows, rubric=Rubric(funcs=[length_parity]), max_turns=max_turns, name="echo", **kw)
'''

# Qwen3's rule: an assistant turn before the last user message is rendered without its
# <think>...</think> block. Otherwise ChatML, prefix-preserving like sandgym's tiny template.
QWEN3_STYLE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% set c = m['content'] or '' %}"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in c %}"
    "{{ c.split('</think>')[-1].lstrip('\\n') }}"
    "{% else %}{{ c }}{% endif %}"
    "<|im_end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}<|im_start|>assistant\n{% endif %}"
)


def _records(path: Path, replies: list[str], turns: int = 2) -> Path:
    """Text records (what `sandgym eval` writes for an offline policy) of the echo chat."""
    with path.open("w") as f:
        for i in range(24):
            prompt = [{"role": "user", "content": f"salut {i % 8} é"}]
            ts = []
            msgs = list(prompt)
            for t in range(turns):
                reply = {"role": "assistant", "content": replies[(i + t) % len(replies)]}
                env = [{"role": "user", "content": "encore ü"}] if t + 1 < turns else []
                ts.append(Turn(prompt=list(msgs), completion=reply, env_response=env))
                msgs += [reply, *env]
            f.write(State(prompt=prompt, turns=ts, reward=1.0).model_dump_json() + "\n")
    return path


def _teach(tmp: Path, replies: list[str], template: str | None = None, steps: int = 40) -> Path:
    cfg = SFTConfig.model_validate(
        {
            "data": {"paths": [str(_records(tmp / "records.jsonl", replies))]},
            "optim": {"steps": steps, "batch_size": 8, "lr": 1e-2, "seed": 0},
            "output": {"dir": str(tmp / "sft")},
        }
    )
    tr = SFTTrainer(cfg)
    if template is not None:  # the SFT renderer reads the tokenizer's template
        tr.tokenizer.chat_template = template
        from sandgym.train.trajectory import record_to_sequence

        tr.sequences = [record_to_sequence(json.loads(x), tr.tokenizer) for x in (tmp / "records.jsonl").read_text().splitlines()]
    hist = tr.run()
    assert hist[-1]["loss"] < hist[0]["loss"] * 0.5, hist[-1]
    return tmp / "sft"


def _trainer(tmp: Path, init_from: Path, monkeypatch: pytest.MonkeyPatch, **env: object) -> Trainer:
    (tmp / "echo_env.py").write_text(ECHO_ENV)
    monkeypatch.syspath_prepend(str(tmp))
    cfg = TrainConfig.model_validate(
        {
            "model": {"init_from": str(init_from)},
            "backend": {"kind": "hf", "max_batch_size": 16},
            "env": {"kind": "sandgym", "name": "echo_env", "args": {"max_turns": 3}, "on_prefix_mismatch": "skip", **env},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_tokens": 24, "temperature": 1.0},
            "optim": {"steps": 1, "lr": 1e-4, "seed": 0},
            "output": {"dir": str(tmp / "run"), "resume": False, "plot": False},
        }
    )
    return Trainer(cfg)


def _rollouts(tr: Trainer, token_in: bool) -> list[State]:
    tr.source.token_in = token_in
    groups, _ = tr.generate(0)
    tr.assign_advantages(groups)
    states = [s for g in groups for s in g]
    assert all(s.error is None for s in states), [s.error for s in states if s.error]
    return states


def test_non_round_tripping_tokenizer_trains_with_zero_skipped_rollouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sft = _teach(tmp_path, ["é à ü ok", "üé", "ça va é"])
    tr = _trainer(tmp_path, sft, monkeypatch)
    tok = tr.tokenizer
    tr.backend = make_backend(tr.cfg, tr.model, tok, tr.device)
    tr.backend.start()
    try:
        states = _rollouts(tr, token_in=True)
        multi = [s for s in states if len(s.turns) > 1]
        assert len(multi) >= len(states) // 2, [len(s.turns) for s in states]
        # The case at hand: what the model generated does not survive decode -> encode.
        comps = [t.tokens.completion_ids for s in states for t in s.turns]
        assert any(tok(tok.decode(c, skip_special_tokens=True), add_special_tokens=False)["input_ids"] != c for c in comps)
        for s in multi:
            assert [t.token_in for t in s.turns] == [False] + [True] * (len(s.turns) - 1)
        seqs, skipped = tr.sequences(states)
        assert skipped == 0 and len(seqs) == len(states)
        m = tr.policy.step(seqs)
        # The trainer scores every completion token in the context the sampler had.
        assert m["inference_logprob_abs_diff"] < 1e-3

        # Message-in on the same model: the server re-renders decoded text and the prefix
        # property breaks -- the rollouts today's "skip" would drop.
        states = _rollouts(tr, token_in=False)
        _, skipped = tr.sequences(states)
        assert skipped > 0
    finally:
        tr.backend.close()


def test_qwen3_style_template_that_drops_reasoning_yields_consistent_sequences(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sft = _teach(tmp_path, ["<think>hm</think>oui"], template=QWEN3_STYLE, steps=100)
    tr = _trainer(tmp_path, sft, monkeypatch)
    tok = tr.tokenizer
    tok.chat_template = QWEN3_STYLE
    tr.backend = make_backend(tr.cfg, tr.model, tok, tr.device)
    tr.backend.start()
    try:
        states = _rollouts(tr, token_in=True)
        thought = [s for s in states if len(s.turns) > 1 and "</think>" in tok.decode(s.turns[0].tokens.completion_ids)]
        assert thought, "the taught model should think before answering"
        for s in thought:
            seq = state_to_sequence(s)
            for t in s.turns:
                # Each turn's prompt is a prefix of the training sequence: the model saw
                # exactly that, earlier <think> blocks included.
                assert seq.input_ids[: len(t.tokens.prompt_ids)] == t.tokens.prompt_ids
            first = s.turns[0].tokens
            assert s.turns[1].tokens.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == first.prompt_ids + first.completion_ids
            assert seq.num_loss_tokens == sum(len(t.tokens.completion_ids) for t in s.turns)
        seqs, skipped = tr.sequences(states)
        assert skipped == 0
        m = tr.policy.step(seqs)
        assert m["inference_logprob_abs_diff"] < 1e-3

        # Message-in: the server's template drops turn 1's reasoning from turn 2's prompt.
        states = _rollouts(tr, token_in=False)
        broken = [s for s in states if len(s.turns) > 1 and "</think>" in tok.decode(s.turns[0].tokens.completion_ids)]
        assert broken
        with pytest.raises(PrefixMismatchError, match="turn 1"):
            state_to_sequence(broken[0])
    finally:
        tr.backend.close()
