"""The model endpoint misbehaves: HTTP 500s, timeouts and malformed JSON, some transient and
some permanent. The eval retries the transient ones (the rollout then succeeds), marks the
permanent ones as errored rollouts after the retries, and always finishes with one record
per rollout: never a crashed run. Each failure keeps its root cause (an exception group a
task group made is unwrapped), and a run whose rollouts mostly failed for infrastructure
exits 3 (--max-infra-failure-rate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandgym import envs
from sandgym.core.clients import OpenAIClient
from sandgym.core.evaluation import run_eval
from sandgym.core.testing import MockOpenAIServer, Reply

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]

MAX_RETRIES = 2
CLIENT_TIMEOUT_S = 1.0
FAULTS = {  # name -> the failing reply
    "http500": Reply(status=500),
    "http503": Reply(status=503),
    "timeout": Reply(delay_s=CLIENT_TIMEOUT_S * 3, content="too late"),
    "malformed": Reply(malformed=True),
}
# One task per (fault, transient?) plus a healthy one; the order is the env's task order.
PLAN = [("healthy", None)] + [(f, True) for f in FAULTS] + [(f, False) for f in FAULTS]


async def test_model_faults_are_retried_then_marked_never_crash(tmp_path: Path) -> None:
    env = envs.load_environment("tool_use", num_tasks=len(PLAN))
    rows = list(env.rows())
    assert len(rows) == len(PLAN)
    by_question = {r["question"]: (r, *PLAN[i]) for i, r in enumerate(rows)}
    calls: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()

    def responder(body: dict[str, Any]) -> Reply:
        msgs = body["messages"]
        question = next(m["content"] for m in msgs if m["role"] == "user")
        row, fault, transient = by_question[question]
        turn = sum(1 for m in msgs if m["role"] == "assistant")
        with lock:
            calls[(question, turn)] += 1
            n = calls[(question, turn)]
        if fault != "healthy" and (not transient or n == 1):
            return FAULTS[fault]  # permanent: every attempt; transient: the first only
        if not any(m["role"] == "tool" for m in msgs):
            name, args = json.loads(row["info"]["plan"])[0]
            return Reply(tool_calls=[{"name": name, "arguments": args}])
        return Reply(content=f"<answer>{row['answer']}</answer>")

    with MockOpenAIServer(responder) as srv:
        client = OpenAIClient(srv.base_url, timeout_s=CLIENT_TIMEOUT_S, max_retries=MAX_RETRIES, backoff_s=0.01, max_backoff_s=0.05)
        try:
            summary = await run_eval(env, client, "mock", output_dir=tmp_path / "run", concurrency=4, provider="local")
        finally:
            await client.aclose()
            await env.close()

    records = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["example_id"] for r in records) == list(range(len(PLAN)))  # one each, none lost
    assert summary["num_rollouts"] == len(PLAN)
    by_id = {r["example_id"]: r for r in records}
    for i, (fault, transient) in enumerate(PLAN):
        rec = by_id[i]
        question = rows[i]["question"]
        if fault == "healthy" or transient:
            assert rec.get("error") in (None, ""), (fault, rec.get("error"))
            assert rec["reward"] == 1.0, (fault, rec["reward"])
            if transient:
                assert calls[(question, 0)] == 2, (fault, calls[(question, 0)])  # failed once, retried once
        else:
            assert rec.get("error"), f"{fault}: a permanently failing model must mark the rollout"
            assert f"after {MAX_RETRIES + 1} attempt(s)" in rec["error"], rec["error"]
            assert rec["error_kind"] == "model", (fault, rec["error_kind"])
            assert rec["reward"] == 0.0
            assert calls[(question, 0)] == MAX_RETRIES + 1, (fault, calls[(question, 0)])
    assert summary["errors"] == len(FAULTS), summary
    # Model failures are infrastructure failures, not rewards: the healthy and transient
    # rollouts (all reward 1) make the valid mean 1.0; counting failures as 0 would not.
    assert summary["error_kinds"] == {"model": len(FAULTS)}, summary
    assert summary["infra_failure_rate"] == len(FAULTS) / len(PLAN)
    assert summary["reward_mean"] == 1.0 and summary["reward_mean_with_failures"] < 1.0, summary


def _eval_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "sandgym", "eval", *args], capture_output=True, text=True, timeout=600, env=env)


def test_an_endpoint_that_is_down_fails_the_run_and_keeps_each_cause(tmp_path: Path) -> None:
    """Every model call answers HTTP 500. Single-turn humaneval and multi-turn humaneval_tools
    (whose turns run inside a task group) record the same root cause, and `sandgym eval`
    exits 3, saying why, instead of 0: infra_failure_rate 1.0 is no measurement."""
    causes = {}
    with MockOpenAIServer(lambda body: Reply(status=500)) as srv:
        for env_name in ("humaneval", "humaneval_tools"):
            out = tmp_path / env_name
            proc = _eval_cli(env_name, "-n", "2", "--base-url", srv.base_url, "--model", "m", "--max-retries", "1",
                             "--provider", "local", "-o", str(out), "--json")
            assert proc.returncode == 3, (env_name, proc.stderr[-3000:])
            why = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
            assert len(why) == 1 and why[0].startswith("error: 2/2 rollouts (100%) failed for infrastructure reasons (model 2)"), proc.stderr[-3000:]
            assert "--max-infra-failure-rate 0.1" in why[0] and str(out / "results.jsonl") in why[0]
            summary = json.loads(proc.stdout.strip().splitlines()[-1])  # the summary is still printed and kept
            assert summary["infra_failure_rate"] == 1.0 and (out / "summary.json").exists()
            recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
            assert [r["error_kind"] for r in recs] == ["model", "model"]
            causes[env_name] = {r["error"] for r in recs}
        # A run may allow every rollout to fail: then it exits 0.
        allowed = _eval_cli("humaneval", "-n", "1", "--base-url", srv.base_url, "--max-retries", "0", "--provider", "local",
                            "-o", str(tmp_path / "allowed"), "--max-infra-failure-rate", "1")
        assert allowed.returncode == 0, allowed.stderr[-3000:]
    prefix = "ModelError: model call failed after 2 attempt(s): InternalServerError: Error code: 500"
    for env_name, errors in causes.items():
        assert all(e.startswith(prefix) for e in errors), (env_name, errors)
        assert not any("TaskGroup" in e or "ExceptionGroup" in e for e in errors), (env_name, errors)


def test_an_exception_group_is_named_by_what_it_holds() -> None:
    from sandgym.core.clients import ModelError
    from sandgym.core.failures import classify, error_text

    async def fails() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep, 10)
            raise ModelError("model call failed after 1 attempt(s): InternalServerError: Error code: 500")

    try:
        anyio.run(fails)
    except BaseException as exc:
        group = exc
    assert isinstance(group, BaseExceptionGroup)
    assert error_text(group) == "ModelError: model call failed after 1 attempt(s): InternalServerError: Error code: 500"
    assert classify(group) == "model"
    two = ExceptionGroup("two", [ValueError("first"), ExceptionGroup("inner", [KeyError("second")])])
    assert error_text(two) == "ValueError: first (and 1 more; the next: KeyError: 'second')"
