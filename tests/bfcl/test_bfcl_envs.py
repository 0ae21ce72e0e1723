"""BFCL v4 end to end in real sandgym/bfcl sandboxes (built on first use when missing): oracle and null per category (a fast
subset; SANDGYM_BENCH_FULL=1 runs every entry), the multi-turn backends executing inside the
rollout's sandbox, and agreement with BFCL's own `bfcl evaluate` on the same outputs."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

require("bfcl_eval")

from sandgym import envs
from sandgym.bfcl import data
from sandgym.bfcl.export import bfcl_evaluate, compare, export_results, is_partial, load_records
from sandgym.bfcl.imperfect import ImperfectOracle
from sandgym.core.clients import ModelResponse
from sandgym.core.evaluation import run_eval
from sandgym.core.policies import get_policy
from sandgym.core.tools import tool_call
from tests.conftest import require

# sandgym/bfcl is built by the first sandbox that needs it when missing (bootstrap builds only
# the core images): several minutes on a loaded machine, hence the longer limit.
pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.timeout(1800)]

FULL = os.environ.get("SANDGYM_BENCH_FULL") == "1"
PER_CATEGORY = None if FULL else 3


def by_category(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["info"]["category"]].append(rec)
    return out


async def test_single_turn_oracle_scores_1_and_null_0_per_category(tmp_path: Path) -> None:
    require("docker")
    env = envs.load_environment("bfcl_v4_single_turn", per_category=PER_CATEGORY)
    good = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o", concurrency=8)
    bad = await run_eval(env, get_policy("null", env), "null", output_dir=tmp_path / "n", concurrency=8)
    assert good["errors"] == 0 and bad["errors"] == 0
    oracle, null = by_category(tmp_path / "o"), by_category(tmp_path / "n")
    assert set(oracle) == set(data.SINGLE_TURN_CATEGORIES)
    for cat in data.SINGLE_TURN_CATEGORIES:
        # Every entry passes but the few whose ground truth no output can satisfy.
        assert all(r["reward"] == 1.0 for r in oracle[cat] if r["info"]["id"] not in data.UNSCORABLE), cat
        expected_null = 1.0 if cat in ("irrelevance", "live_irrelevance") else 0.0
        assert all(r["reward"] == expected_null for r in null[cat]), cat
    rec = oracle["parallel"][0]
    assert isinstance(rec["info"]["bfcl_result"], list) and len(rec["info"]["bfcl_result"]) >= 2  # parallel calls
    assert rec["info"]["bfcl_valid"] is True


async def test_multi_turn_oracle_scores_1_and_null_0_per_category(tmp_path: Path) -> None:
    require("docker")
    env = envs.load_environment("bfcl_v4_multi_turn", per_category=None if FULL else 2)
    good = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o", concurrency=4)
    bad = await run_eval(env, get_policy("null", env), "null", output_dir=tmp_path / "n", concurrency=4)
    assert good["errors"] == 0 and bad["errors"] == 0
    assert good["reward_mean"] == 1.0 and bad["reward_mean"] == 0.0
    oracle = by_category(tmp_path / "o")
    assert set(oracle) == set(data.MULTI_TURN_CATEGORIES)
    for recs in oracle.values():
        for r in recs:
            entry = next(e for e in data.load_entries(r["info"]["category"]) if e.id == r["info"]["id"])
            assert len(r["info"]["bfcl_result"]) == len(entry.turns) and r["sandbox_id"]
    # The backends answered: the file system's `cd` returns the new directory.
    base = next(r for r in oracle["multi_turn_base"] if r["info"]["id"] == "multi_turn_base_0")
    tool_msgs = [m["content"] for t in base["turns"] for m in t["env_response"] if m["role"] == "tool"]
    assert any("current_working_directory" in c for c in tool_msgs), tool_msgs[:3]
    # miss_func: the held-out functions were offered at their turn, with BFCL's message.
    miss = next(r for r in oracle["multi_turn_miss_func"] if r["info"]["id"] == "multi_turn_miss_func_0")
    users = [m["content"] for t in miss["turns"] for m in t["env_response"] if m["role"] == "user"]
    assert data.additional_function_prompt() in users


class HostnameProbe:
    """Calls a "function" whose name is Python that BFCL's backend evals as it is: the call
    string runs wherever the backends run."""

    name = "probe"

    async def chat(self, messages: Any, *, model: str = "probe", tools: Any = None, sampling_args: Any = None, state: Any = None) -> ModelResponse:
        if not any(m.get("role") == "tool" for m in messages):
            call = tool_call("open('/etc/hostname').read", {}, "call_probe")
            return ModelResponse(message={"role": "assistant", "content": None, "tool_calls": [call]}, finish_reason="tool_calls")
        # The sandbox is still up: ask the engine what that container is called.
        import docker

        self.container_name = docker.from_env().containers.get(state.sandbox_id).name
        return ModelResponse(message={"role": "assistant", "content": "done"}, finish_reason="stop")


async def test_model_calls_are_evaluated_inside_the_rollout_sandbox(tmp_path: Path) -> None:
    require("docker")
    env = envs.load_environment("bfcl_v4_multi_turn", ids=["multi_turn_base_0"])
    probe = HostnameProbe()
    s = await run_eval(env, probe, "probe", output_dir=tmp_path, concurrency=1)
    assert s["errors"] == 0 and s["reward_mean"] == 0.0
    rec = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
    answer = rec["turns"][0]["env_response"][0]["content"].strip()
    # A sandbox's hostname is its container's name: the call ran in the rollout's sandbox.
    assert answer and answer == probe.container_name and answer != os.uname().nodename


async def test_sandgym_and_bfcl_evaluate_agree_per_category(tmp_path: Path) -> None:
    """An imperfect policy (wrong on a third of its steps) over a subset of every category,
    plus the entries no output can pass: sandgym's per-category (correct, total) equals what
    `bfcl evaluate` -- BFCL's own CLI, in a sandgym/bfcl sandbox -- reports for the same
    outputs."""
    require("docker")
    runs = []
    for kind, n in (("single_turn", None if FULL else 4), ("multi_turn", None if FULL else 3)):
        ids = list(data.UNSCORABLE) if kind == "single_turn" else None
        env = envs.load_environment(f"bfcl_v4_{kind}", per_category=n, ids=ids)
        s = await run_eval(env, ImperfectOracle(env), "imperfect", output_dir=tmp_path / kind, concurrency=6)
        assert s["errors"] == 0
        runs.append(tmp_path / kind)
    records = load_records(runs)
    counts = export_results(records, tmp_path / "bfcl")
    ev = await bfcl_evaluate(tmp_path / "bfcl", list(counts), partial=is_partial(counts))
    rows = compare(records, ev)
    assert [r["category"] for r in rows] == list(data.SINGLE_TURN_CATEGORIES + data.MULTI_TURN_CATEGORIES)
    assert all(r["agree"] for r in rows), rows
    # The policy is neither always right nor always wrong, so agreeing means something.
    accs = [r["sandgym"] for r in rows]
    assert any(0.0 < a < 1.0 for a in accs) and max(accs) > 0.0


async def test_the_scorer_skips_only_sdks_its_models_handler_does_not_use() -> None:
    """The default model's scorer gives the other vendors' SDKs stand-ins (seconds of imports
    saved); a handler that needs one fails loudly there, and a scorer for any other model
    imports everything as BFCL does."""
    require("docker")
    from sandgym.bfcl import sandbox_code
    from sandgym.bfcl.scoring import SingleTurnScorer
    from sandgym.core.sandbox_repl import session_service
    from sandgym.sandboxes import SandboxManager, SandboxSpec

    spec = SandboxSpec(image=data.BFCL_IMAGE, memory_mb=1024, disk_mb=64)
    probe = (
        "import sys\n"
        "print('SKIPPED', sorted(n for n in sys.modules if type(sys.modules[n]).__name__ == '_SgStandInModule'))\n"
        "try:\n    _sg_runner.get_handler('claude-opus-4-5-20251101')\nexcept ImportError as e:\n    print('CLAUDE', e)\n"
    )
    async with SandboxManager("docker", max_sandboxes=1) as mgr:
        async with session_service(lambda tg: SingleTurnScorer(mgr, spec, tg)) as scorer:
            reply = await scorer.service.run(probe, timeout=120)
    assert reply.ok, reply
    skipped = reply.stdout.split("SKIPPED ", 1)[1].splitlines()[0]
    assert "'anthropic'" in skipped and "'openai'" not in skipped, skipped
    assert "CLAUDE anthropic.Anthropic is not imported by sandgym's BFCL scorer" in reply.stdout, reply.stdout
    # Another model's handler may need any SDK: nothing is skipped for it.
    assert "_SgStandIns" not in sandbox_code.scorer_setup() and "_SgStandIns" in sandbox_code.scorer_setup(("anthropic",))
    other = SingleTurnScorer(mgr, spec, None, model="claude-opus-4-5-20251101")  # type: ignore[arg-type]
    assert "_SgStandIns" not in other.service.setup_code
