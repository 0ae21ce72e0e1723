"""The shipped environments end to end (oracle and null policies in real sandboxes), EnvGroup
routing, the eval record log, and `sandgym eval --resume` after a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandgym import envs
from sandgym.core.clients import OpenAIClient
from sandgym.core.env_group import EnvGroup
from sandgym.core.environment import SingleTurnEnv
from sandgym.core.evaluation import run_eval
from sandgym.core.policies import get_policy
from sandgym.core.rubric import Rubric
from sandgym.core.testing import MockOpenAIServer, Reply
from sandgym.run_folder import RecordLog
from sandgym.sandboxes.registry import get_provider
from sandgym.sandboxes.spec import LABEL_PID
from tests.conftest import require

pytestmark = pytest.mark.anyio


def require_provider(name: str) -> None:
    if name == "docker":
        require("docker")


@pytest.mark.docker
@pytest.mark.parametrize("provider", ["docker", "local"])
@pytest.mark.parametrize("tools", [False, True])
async def test_humaneval_oracle_scores_1_and_null_scores_0(provider: str, tools: bool, tmp_path: Path) -> None:
    require_provider(provider)
    env = envs.load_environment("humaneval", tools=tools)
    n = 5 if not tools else 3
    good = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o", num_examples=n, concurrency=3, provider=provider)
    bad = await run_eval(env, get_policy("null", env), "null", output_dir=tmp_path / "n", num_examples=n, concurrency=3, provider=provider)
    assert good["num_rollouts"] == n and good["reward_mean"] == 1.0 and good["errors"] == 0 and good["pass_at_k"]["1"] == 1.0
    assert bad["num_rollouts"] == n and bad["reward_mean"] == 0.0 and bad["errors"] == 0
    recs = [json.loads(line) for line in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["example_id"] for r in recs) == list(range(n))
    if tools:  # the oracle went through the python tool, and the tool said the tests passed
        for r in recs:
            assert r["turns"][0]["completion"]["tool_calls"][0]["function"]["name"] == "python"
            assert "all tests passed" in r["turns"][0]["env_response"][0]["content"]
            assert r["sandbox_id"]


def test_humaneval_ships_164_problems_without_download() -> None:
    env = envs.load_environment("humaneval")
    rows = env.rows()
    assert len(rows) == 164 and rows[0]["info"]["task_id"] == "HumanEval/0"
    assert envs.load_environment("humaneval-tools").name == "humaneval_tools"
    assert envs.load_environment("sandgym.envs.tool_use", num_tasks=3).name == "tool_use"  # dotted path
    with pytest.raises(ValueError, match="unknown environment"):
        envs.load_environment("no_such_env_here")


async def test_tool_use_oracle_solves_every_task_through_tools_and_null_fails(tmp_path: Path) -> None:
    env = envs.load_environment("tool_use", num_tasks=25)
    good = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o", concurrency=8)
    bad = await run_eval(env, get_policy("null", env), "null", output_dir=tmp_path / "n", concurrency=8)
    assert good["reward_mean"] == 1.0 and good["num_rollouts"] == 25 and good["metrics"]["tool_calls"] >= 2
    assert bad["reward_mean"] == 0.0
    # same answers are deterministic across loads
    assert [r["answer"] for r in envs.load_environment("tool_use", num_tasks=25).rows()] == [r["answer"] for r in env.rows()]


async def test_env_group_routes_rows_to_their_environment() -> None:
    tool_env = envs.load_environment("tool_use", num_tasks=4)

    def exact(completion, answer) -> float:
        return 1.0 if completion[-1]["content"] == answer else 0.0

    echo = SingleTurnEnv(eval_dataset=[{"question": f"say {w}", "answer": w} for w in ("red", "blue")], rubric=Rubric([exact]), name="echo")
    group = EnvGroup([tool_env, echo])
    rows = group.rows()
    assert [r["task"] for r in rows] == ["tool_use"] * 4 + ["echo"] * 2
    states = await group.generate(get_policy("oracle", group), "oracle", rows, rollouts_per_example=2)
    assert len(states) == 12 and all(s.reward == 1.0 and s.error is None for s in states), [s.error for s in states]
    assert {s.task for s in states} == {"tool_use", "echo"}
    assert all(len(s.turns) >= 3 for s in states if s.task == "tool_use")
    assert all(len(s.turns) == 1 for s in states if s.task == "echo")
    assert all(s.advantage == 0.0 for s in states)  # equal rewards in every group

    # with a model: only the tool_use rows are offered tools
    def responder(body):
        return Reply(content=body["messages"][-1]["content"].removeprefix("say "))

    with MockOpenAIServer(responder) as srv:
        client = OpenAIClient(srv.base_url, max_retries=0)
        states = await group.generate(client, "m", rows)
        await client.aclose()
    by_task = {s.task: s for s in states}
    assert by_task["echo"].reward == 1.0 and by_task["tool_use"].reward == 0.0
    offered = {(r["messages"][-1]["content"].startswith("say ")): bool(r.get("tools")) for r in srv.requests}
    assert offered == {True: False, False: True}


def test_record_log_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"example_id": 0, "rollout_index": 0, "reward": 1}) + "\n" + '{"example_id": 1, "rollo')
    log = RecordLog(path)
    assert log.done() == {(0, 0)}
    log.append({"example_id": 1, "rollout_index": 0, "reward": 0})
    log.append({"example_id": 1, "rollout_index": 0, "reward": 0})  # a duplicate is ignored
    log.close()
    lines = path.read_text().splitlines()
    assert [json.loads(x)["example_id"] for x in lines] == [0, 1]


@pytest.mark.docker
@pytest.mark.slow
async def test_eval_killed_with_sigkill_then_resumed_has_one_record_per_rollout(tmp_path: Path) -> None:
    require("docker")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "oracle", "-n", "12", "-r", "2", "-c", "2", "--provider", "docker"]
    proc = subprocess.Popen([*cmd, "-o", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    results = run / "results.jsonl"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if results.exists() and results.read_text().count("\n") >= 4:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        # The killed run's sandboxes carry its pid: remove them (a later `prune` would too).
        provider = get_provider("docker")
        for info in await provider.list({LABEL_PID: str(proc.pid)}):
            await provider.remove(info.id)
        await provider.aclose()
    before = [json.loads(x) for x in results.read_text().splitlines() if x.strip().endswith("}")]
    assert 4 <= len(before) < 24, "the kill should land mid-run"
    # The newcomer's line: the env and the folder; the rest is the run's own (its meta).
    out = subprocess.run([sys.executable, "-m", "sandgym", "eval", "humaneval", "-c", "2", "--resume", str(run), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "with its own policy oracle, provider docker, 12 examples x 2 rollouts" in " ".join(out.stderr.split())
    summary = json.loads(out.stdout.strip().splitlines()[-1])  # the JSON summary is last on stdout
    assert summary["num_rollouts"] == 24 and summary["resumed_rollouts"] >= len(before) - 1
    assert summary["new_rollouts"] == 24 - summary["resumed_rollouts"]
    assert summary["reward_mean"] == 1.0 and summary["pass_at_k"] == {"1": 1.0, "2": 1.0}
    keys = [(r["example_id"], r["rollout_index"]) for r in map(json.loads, results.read_text().splitlines())]
    assert sorted(keys) == [(e, i) for e in range(12) for i in range(2)]  # exactly one each


def test_cli_eval_with_a_model_records_tokens_and_prints_json_last(tmp_path: Path) -> None:
    """`sandgym eval --base-url` against the mock server (real HTTP, a real subprocess)."""
    env = envs.load_environment("tool_use", num_tasks=2)
    answers = {r["question"]: r for r in env.rows()}

    def responder(body):
        msgs = body["messages"]
        row = answers[next(m["content"] for m in msgs if m["role"] == "user")]
        if not any(m["role"] == "tool" for m in msgs):
            name, args = json.loads(row["info"]["plan"])[0]
            return Reply(tool_calls=[{"name": name, "arguments": args}])
        return Reply(content=f"<answer>{row['answer']}</answer>")

    with MockOpenAIServer(responder) as srv:
        out = subprocess.run(
            [sys.executable, "-m", "sandgym", "eval", "tool_use", "-n", "2", "-r", "2", "--base-url", srv.base_url,
             "--model", "mock", "-a", "num_tasks=2", "-o", str(tmp_path / "run"), "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["num_rollouts"] == 4 and summary["reward_mean"] == 1.0 and summary["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert summary["usage"]["completion_tokens"] > 0
    recs = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 4
    for r in recs:
        assert [t["token_source"] for t in r["turns"]] == ["return_token_ids", "return_token_ids"]
        t0, t1 = r["turns"][0]["tokens"], r["turns"][1]["tokens"]
        assert t1["prompt_ids"][: len(t0["prompt_ids"]) + len(t0["completion_ids"])] == t0["prompt_ids"] + t0["completion_ids"]
    # a resume of a finished run adds nothing; a different env in the same dir is refused
    again = subprocess.run(
        [sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "null", "--resume", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"},
    )
    assert again.returncode == 2 and "holds another run (env: 'tool_use', now 'humaneval')" in again.stderr, again.stderr


def test_resume_takes_the_runs_own_settings_from_its_meta(tmp_path: Path) -> None:
    """`sandgym eval ENV --resume RUN` alone: policy, env args, provider, examples and rollouts
    are the run's own; given again, an option wins (and the same-run rule still applies)."""
    run = tmp_path / "run"
    eval_ = [sys.executable, "-m", "sandgym", "eval", "tool_use"]
    first = subprocess.run([*eval_, "--policy", "oracle", "-a", "num_tasks=3", "-n", "3", "-r", "2", "--provider", "local",
                            "-o", str(run), "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    results = run / "results.jsonl"
    lines = results.read_text().splitlines()
    results.write_text("".join(x + "\n" for x in lines[:-2]))  # as if killed before the last two finished
    again = subprocess.run([*eval_, "--resume", str(run), "--json"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    said = " ".join(again.stderr.split())
    assert 'with its own policy oracle, env args {"num_tasks": 3}, provider local, 3 examples x 2 rollouts' in said, said
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["num_rollouts"] == 6 and summary["resumed_rollouts"] == 4 and summary["new_rollouts"] == 2
    assert summary["reward_mean"] == 1.0  # the oracle's: the null policy would have scored 0
    # An option given again is not replaced; another policy is another run, refused as before.
    other = subprocess.run([*eval_, "--policy", "null", "--resume", str(run)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    assert other.returncode == 2 and "holds another run" in other.stderr, other.stderr[-2000:]


async def test_resume_refuses_a_folder_holding_another_runs_records(tmp_path: Path) -> None:
    from sandgym.errors import UserError

    def exact(completion, answer) -> float:
        return float(completion[-1]["content"] == answer)

    env = SingleTurnEnv(eval_dataset=[{"question": f"say {w}", "answer": w} for w in ("red", "blue")], rubric=Rubric([exact]), name="echo")
    out = tmp_path / "run"
    first = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=out, num_examples=1, meta={"checkpoint": "a/step_12"})
    assert first["num_rollouts"] == 1
    # The same run, asked for more: resumes (one record kept, one added).
    more = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=out, num_examples=2, meta={"checkpoint": "a/step_12"})
    assert more["num_rollouts"] == 2 and more["resumed_rollouts"] == 1
    # Another checkpoint into the same folder would mix two policies in one summary.
    with pytest.raises(UserError, match="checkpoint"):
        await run_eval(env, get_policy("oracle", env), "oracle", output_dir=out, num_examples=2, meta={"checkpoint": "a/step_20"})
    with pytest.raises(UserError, match="model"):
        await run_eval(env, get_policy("null", env), "null", output_dir=out, num_examples=2, meta={"checkpoint": "a/step_12"})
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
