"""Multi-turn sandboxed tool use end to end: the `humaneval_tools` environment (PythonEnv, a
REPL in a Docker sandbox per rollout) driven through the trainer's transformers backend with
chat completions and tools; the rollouts' token ids become training sequences (prefix checked
turn by turn) and the trainer takes a step on them.

A random model never writes a tool call, so the test first teaches a tiny model (supervised,
on CPU, ~100-200 steps) to answer every prompt with one fixed Hermes-style tool call."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import require

pytestmark = pytest.mark.docker

TOOL_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call><|im_end|>'


def _teach_tool_call(out: Path) -> Path:
    from sandgym import envs
    from sandgym.models.tiny import byte_tokenizer, tiny_qwen2

    tok = byte_tokenizer()
    env = envs.load_environment("humaneval_tools", max_turns=3)
    target = tok(TOOL_CALL, add_special_tokens=False)["input_ids"]
    prompts = []
    for row in env.rows(1, split="train"):  # the row the trainer rolls out first
        text = tok.apply_chat_template(env.format_prompt(row), tools=env.tool_schemas, add_generation_prompt=True, tokenize=False)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    model = tiny_qwen2(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(400):
        loss = torch.zeros(())
        for p in prompts:
            ids = torch.tensor([p + target])
            labels = ids[0, 1:].clone()
            labels[: len(p) - 1] = -100
            loss = loss + torch.nn.functional.cross_entropy(model(input_ids=ids).logits[0, :-1], labels, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if float(loss) < 0.05 * len(prompts):
            break
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_python_env_multiturn_rollouts_train(tmp_path: Path) -> None:
    require("docker")
    from sandgym.train.batch import states_to_sequences
    from sandgym.train.config import TrainConfig
    from sandgym.train.trainer import Trainer, make_backend

    model_dir = _teach_tool_call(tmp_path / "model")
    cfg = TrainConfig.model_validate(
        {
            "model": {"name_or_path": str(model_dir)},
            "backend": {"kind": "hf"},
            "env": {"kind": "sandgym", "name": "humaneval_tools", "args": {"max_turns": 3}, "provider": "docker", "max_sandboxes": 2},
            "rollout": {"prompts_per_step": 1, "group_size": 2, "max_tokens": 96, "temperature": 0.0},
            "optim": {"steps": 1, "lr": 1e-4},
            "output": {"dir": str(tmp_path / "run"), "resume": False, "plot": False},
        }
    )
    tr = Trainer(cfg)
    tr.backend = make_backend(cfg, tr.model, tr.tokenizer, tr.device)
    tr.backend.start()
    try:
        groups, _ = tr.generate(0)
    finally:
        tr.backend.close()
    states = [s for g in groups for s in g]
    assert len(states) == 2
    for st in states:
        assert st.error is None, st.error
        # Turn 1 is the taught tool call; after the tool result the prompt is new to the
        # model, which may call again (up to max_turns = 3) or answer.
        assert 2 <= len(st.turns) <= 3
        assert st.turns[0].completion.get("tool_calls"), st.turns[0].completion
        assert all(t.tokens is not None and t.tokens.completion_ids for t in st.turns)
        assert st.turns[0].tokens.completion_ids[-1] == tr.tokenizer.eos_token_id
        # The sandboxed REPL really ran the code: its output is in the next prompt.
        assert "42" in str(st.turns[0].env_response)
    tr.assign_advantages(groups)
    seqs = states_to_sequences(states)  # raises PrefixMismatchError if any turn breaks the prefix
    for st, seq in zip(states, seqs):
        assert seq.num_loss_tokens == sum(len(t.tokens.completion_ids) for t in st.turns)
        assert seq.input_ids[: len(st.turns[-1].tokens.prompt_ids)] == st.turns[-1].tokens.prompt_ids
    m = tr.policy.step(seqs)
    assert m["loss_tokens"] == sum(s.num_loss_tokens for s in seqs)  # every completion token is trained
    assert m["inference_logprob_abs_diff"] < 1e-3
