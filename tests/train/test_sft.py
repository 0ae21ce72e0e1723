"""`sandgym sft`: rollout records -> token sequences in the token-in layout -> supervised steps;
tool-response tokens carry no loss (zero gradient), in SFT and in GRPO; the checkpoint starts
a GRPO run (`[model] init_from`); bad input stops before any model is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sandgym.core.state import State, Turn
from sandgym.core.tools import tool_call
from sandgym.envs.pycalc import QUESTIONS, load_environment
from sandgym.models.tiny import byte_tokenizer, tiny_qwen2
from sandgym.train.attention import use_varlen
from sandgym.train.batch import pack
from sandgym.train.config import LossConfig
from sandgym.train.logprobs import packed_logprobs
from sandgym.train.loss import StepNormalizer, grpo_loss
from sandgym.train.sft import SFTConfig, SFTTrainer, sft_loss
from sandgym.train.trajectory import record_to_sequence, render_state

ROOT = Path(__file__).resolve().parents[2]


def pycalc_record(n: list[int] | None = None, kind: str = "sum") -> State:
    """What `sandgym eval pycalc --policy oracle` records: text, tool schemas, no ids."""
    n = n or [12, 345, 67]
    env = load_environment()
    question, code = QUESTIONS[kind]
    result = str(sum(n) % 10 if kind == "sum" else len(n))
    prompt = [{"role": "user", "content": question}]
    call = {"role": "assistant", "content": "", "tool_calls": [tool_call("python", {"code": code}, "call_0")]}
    tool = [{"role": "tool", "tool_call_id": "call_0", "content": result}]
    answer = {"role": "assistant", "content": result}
    return State(
        prompt=prompt,
        tools=env.tool_schemas,
        info={"kind": kind, "n": n},
        turns=[Turn(prompt=prompt, completion=call, env_response=tool), Turn(prompt=prompt + [call] + tool, completion=answer)],
        reward=1.0,
    )


def test_text_record_renders_in_the_token_in_layout() -> None:
    tok = byte_tokenizer()
    st = pycalc_record()
    ids, mask = render_state(st, tok)
    text = tok.decode(ids)
    # The whole conversation, rendered once by the template (it is prefix-preserving).
    messages = [*st.prompt, st.turns[0].completion, *st.turns[0].env_response, st.turns[1].completion]
    full = tok.apply_chat_template(messages, tools=st.tools, tokenize=False)
    assert text == full
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == '<tool_call>{"name": "python", "arguments": {"code": "print(sum(n)%10)"}}</tool_call><|im_end|>4<|im_end|>'
    # The tool result (and the glue around it) is not trained.
    first = len(tok(text[: text.index("<|im_start|>tool")], add_special_tokens=False)["input_ids"])
    assert not any(mask[first : ids.index(258, first) + 1])
    # The suffix after the first completion equals the template's own suffix rendering.
    k = 2  # messages before the tool result: user, assistant
    msgs = [*st.prompt, st.turns[0].completion, *st.turns[0].env_response]
    suffix = tok.apply_chat_template(msgs, tools=st.tools, suffix_from=k, add_generation_prompt=True, tokenize=False)
    assert suffix in text and suffix.startswith("\n<|im_start|>tool\n4<|im_end|>")


def _loss_grad_on_logprobs(seq_mask_loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """d loss / d logprob(token t) for every target position of a pycalc sequence, with
    logprobs computed at every position (no `only` projection): the loss alone masks."""
    torch.manual_seed(0)
    model = tiny_qwen2(seed=0)
    use_varlen(model)
    seq = record_to_sequence(pycalc_record(), byte_tokenizer())
    seq.advantage = 0.7
    seq.inference_logprobs = [0.0] * len(seq.input_ids)
    (mb,) = pack([seq], 4096)
    lp, _ = packed_logprobs(model, mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, mb.targets, kernel="sdpa")
    lp.retain_grad()
    if seq_mask_loss == "sft":
        loss = sft_loss(lp, mb.mask, float(mb.mask.sum()))
    else:
        norm = StepNormalizer.from_masks([mb.mask], [mb.seq_index], 1)
        loss, _ = grpo_loss(lp, lp.detach() - 0.05, mb.advantages, mb.mask, mb.seq_index, norm, LossConfig())
    loss.backward()
    return lp.grad, mb.mask


@pytest.mark.parametrize("loss", ["sft", "grpo"])
def test_tool_response_tokens_get_zero_gradient(loss: str) -> None:
    grad, mask = _loss_grad_on_logprobs(loss)
    tok = byte_tokenizer()
    seq = record_to_sequence(pycalc_record(), tok)
    text_ids = seq.input_ids
    # Target positions (t predicts token t+1) of the tool message's tokens.
    start = tok.decode(text_ids).index("<|im_start|>tool")
    first = len(tok(tok.decode(text_ids)[:start], add_special_tokens=False)["input_ids"])
    last = text_ids.index(258, first)  # its <|im_end|>
    tool_targets = range(first - 1, last)
    assert set(tool_targets) and all(mask[t] == 0 for t in tool_targets)
    assert all(grad[t] == 0.0 for t in tool_targets)  # exactly zero
    assert torch.count_nonzero(grad[mask == 0]) == 0  # nor any other untrained token
    assert torch.count_nonzero(grad[mask > 0]) == int(mask.sum())  # every completion token has one


def _write_records(path: Path, n: int = 12) -> Path:
    with path.open("w") as f:
        for i in range(n):
            st = pycalc_record([10 + i, 20 * i + 11], kind="sum" if i % 2 else "len")
            f.write(st.model_dump_json() + "\n")
        bad = pycalc_record()
        bad.reward, bad.error = 0.0, "SandboxGoneError: gone"
        f.write(bad.model_dump_json() + "\n")
    return path


def test_sft_learns_and_grpo_starts_from_its_checkpoint(tmp_path: Path) -> None:
    from sandgym.train.config import TrainConfig
    from sandgym.train.trainer import Trainer

    data = _write_records(tmp_path / "results.jsonl")
    (tmp_path / "sft.toml").write_text(
        f'[data]\npaths = ["{data.name}"]\n[optim]\nsteps = 30\nbatch_size = 4\nlr = 1e-2\n[output]\ndir = "sft"\n'
    )
    cfg = SFTConfig.from_toml(tmp_path / "sft.toml")
    tr = SFTTrainer(cfg)
    assert len(tr.sequences) == 12  # the failed record is left out
    hist = tr.run()
    assert hist[-1]["loss"] < 0.5 * hist[0]["loss"]
    ck = tmp_path / "sft" / "checkpoints" / "step_000030" / "trainer_state.pt"
    assert ck.is_file() and len((tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()) == 30

    grpo = TrainConfig.model_validate({"model": {"init_from": str(tmp_path / "sft")}, "output": {"dir": str(tmp_path / "grpo")}})
    t = Trainer(grpo)
    for (name, a), b in zip(t.model.state_dict().items(), tr.model.state_dict().values()):
        assert torch.equal(a, b), name
    bad = TrainConfig.model_validate(
        {"model": {"init_from": str(tmp_path / "sft"), "tiny": {"hidden_size": 32}}, "output": {"dir": str(tmp_path / "x")}}
    )
    with pytest.raises(Exception, match="model.tiny"):
        Trainer(bad)

    # `sandgym eval --checkpoint` serves the run's policy and evaluates it like any model.
    proc = _sandgym("eval", "pycalc", "--checkpoint", "sft", "-n", "2", "--provider", "local", "--max-tokens", "96", "--json", "-o", "ev", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["num_rollouts"] == 2 and summary["errors"] == 0 and summary["model"] == "sft"
    recs = [json.loads(x) for x in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    assert all(r["turns"][0]["tokens"]["completion_ids"] for r in recs)  # records keep ids and text


def _sandgym(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandgym", *args], capture_output=True, text=True, cwd=cwd, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"},
    )


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('[data]\npaths = ["missing.jsonl"]\n', "no records file at"),
        ("[optim]\nsteps = 3\n", "data: Field required"),
        ('[data]\npaths = ["r.jsonl"]\nmin_reward = 2.0\n', "no records without errors and with reward >= 2.0"),
        ('[data]\npaths = ["r.jsonl"]\n[optim]\nbogus = 1\n', "optim.bogus: Extra inputs are not permitted"),
        ('[data]\npaths = ["notes.jsonl"]\n', "not a rollout record"),
    ],
)
def test_sft_user_errors_are_one_line(tmp_path: Path, toml: str, says: str) -> None:
    _write_records(tmp_path / "r.jsonl", n=2)
    (tmp_path / "notes.jsonl").write_text(json.dumps({"hello": 1}) + "\n")
    (tmp_path / "c.toml").write_text(toml)
    proc = _sandgym("sft", "c.toml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_sft_is_independent_of_record_order_and_decays_its_rate(tmp_path: Path) -> None:
    """`sandgym eval` writes records as rollouts finish: two recordings of the same rollouts
    train the same model for a seed. A cosine schedule ends on small steps."""
    states = []
    for i in range(8):
        st = pycalc_record([10 + i, 20 * i + 11], kind="sum" if i % 2 else "len")
        st.example_id = i
        states.append(st)
    weights, lrs = [], []
    for name, order in (("a", states), ("b", states[::-1])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(s.model_dump_json() + "\n" for s in order))
        cfg = SFTConfig.model_validate(
            {"data": {"paths": [str(path)]}, "optim": {"steps": 4, "batch_size": 2, "lr": 1e-2, "schedule": "cosine"},
             "output": {"dir": str(tmp_path / f"sft_{name}")}}
        )
        hist = SFTTrainer(cfg).run()
        lrs.append([m["lr"] for m in hist])
        weights.append(torch.load(tmp_path / f"sft_{name}" / "checkpoints" / "step_000004" / "trainer_state.pt", weights_only=False)["model"])
    for key, a in weights[0].items():
        assert torch.equal(a, weights[1][key]), key
    # The rate logged after each step: cosine from 1e-2 towards 0 over 4 steps.
    assert lrs[0] == lrs[1] and lrs[0][0] < 1e-2 and all(x > y for x, y in zip(lrs[0], lrs[0][1:])) and lrs[0][-1] < 2e-3, lrs[0]
