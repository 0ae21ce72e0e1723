"""BFCL with a model server that fails some calls: sandgym's score, `sandgym bfcl evaluate`
and BFCL's own `bfcl evaluate` agree on every entry, the failed ones included.

The model is a real OpenAI-compatible HTTP server on 127.0.0.1 (sandgym.core.testing). Each
entry's fate is fixed by a seed: its every call fails with HTTP 500, it answers right (the
ground truth; on irrelevance, no call), or it answers wrong (no call; on irrelevance, a
call). The rule (sandgym.bfcl.export): a failed rollout is an infrastructure failure, so it
has no verdict on either side; the irrelevance entries are where that matters, since BFCL
reads a failed inference as "no call", a pass there."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (scripts/bootstrap.sh installs it with --no-deps)")

from sandgym import envs
from sandgym.bfcl import data
from sandgym.bfcl.export import read_score_file, score_path
from sandgym.bfcl.oracle import relevance_call, single_turn_calls
from sandgym.core.testing import MockOpenAIServer, Reply
from sandgym.sandboxes.providers.docker.images import build_missing
from tests.conftest import require

# sandgym/bfcl is built on first use when missing (minutes on a loaded machine).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
SEED = 23
IRRELEVANCE = ("irrelevance", "live_irrelevance")


def first_user(messages: list[dict[str, Any]]) -> str:
    m = next(m for m in messages if m.get("role") == "user")
    c = m.get("content")
    return c if isinstance(c, str) else json.dumps(c, sort_keys=True)


class FailingModel:
    """The fates of a run's entries, and the server's answers by them."""

    def __init__(self, env: Any, fates: tuple[str, ...]) -> None:
        self.by_prompt: dict[str, tuple[str, data.Entry]] = {}
        self.fate: dict[str, str] = {}
        by_cat: dict[str, list[dict[str, Any]]] = {}
        for row in env.rows():
            by_cat.setdefault(row["info"]["category"], []).append(row)
        for cat, rows in sorted(by_cat.items()):
            cycle = list(fates)
            random.Random(f"{SEED}:{cat}").shuffle(cycle)
            for i, row in enumerate(sorted(rows, key=lambda r: r["info"]["id"])):
                entry = env.entries[row["info"]["id"]]
                key = first_user(json.loads(row["prompt"]))
                # Entries that share a prompt share the first one's fate (the server sees prompts).
                fate, _ = self.by_prompt.setdefault(key, (cycle[i % len(cycle)], entry))
                self.fate[entry.id] = fate

    def __call__(self, body: dict[str, Any]) -> Reply:
        fate, e = self.by_prompt[first_user(body["messages"])]
        if fate == "fail":
            return Reply(status=500)
        if e.category.startswith("multi_turn"):
            return Reply(content="I cannot do that with these functions.")
        irrelevant = e.category in IRRELEVANCE
        if fate == "right" and irrelevant or fate == "wrong" and not irrelevant:
            return Reply(content="None of the functions can answer this.")
        if irrelevant:  # wrong: a call where none is due
            return Reply(tool_calls=[{"name": body["tools"][0]["function"]["name"], "arguments": {}}])
        calls = [relevance_call(e)] if e.category == "live_relevance" else single_turn_calls(e)
        return Reply(tool_calls=[{"name": n, "arguments": a} for n, a in calls])


def _sandgym(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "sandgym", *args], capture_output=True, text=True, timeout=1500, env=env)


def records_of(run: Path) -> dict[str, dict[str, Any]]:
    return {r["info"]["id"]: r for r in map(json.loads, (run / "results.jsonl").read_text().splitlines())}


def test_failed_model_calls_have_no_verdict_on_either_side(tmp_path: Path) -> None:
    require("docker")
    # Built here when missing (what a sandbox's first use does): `bfcl evaluate` runs in it below.
    assert build_missing(data.BFCL_IMAGE)
    st_env = envs.load_environment("bfcl_v4_single_turn", per_category=3)
    mt_env = envs.load_environment("bfcl_v4_multi_turn", per_category=2)
    st_model, mt_model = FailingModel(st_env, ("fail", "right", "wrong")), FailingModel(mt_env, ("fail", "text"))
    runs = {"single": tmp_path / "single", "multi": tmp_path / "multi"}
    with MockOpenAIServer(lambda body: (st_model if "single" in body.get("model", "") else mt_model)(body)) as srv:
        common = ("--base-url", srv.base_url, "--max-retries", "1", "-c", "6", "--json")
        single = _sandgym("eval", "bfcl_v4_single_turn", "-m", "single", "-a", "per_category=3", "-o", str(runs["single"]), *common)
        multi = _sandgym("eval", "bfcl_v4_multi_turn", "-m", "multi", "-a", "per_category=2", "-o", str(runs["multi"]), *common,
                         "--max-infra-failure-rate", "1")
    # A third of the model calls fail: past the default --max-infra-failure-rate, exit 3 and why.
    assert single.returncode == 3, single.stderr[-3000:]
    assert "failed for infrastructure reasons (model " in single.stderr and "--max-infra-failure-rate 0.1" in single.stderr
    assert multi.returncode == 0, multi.stderr[-3000:]
    recs = {**records_of(runs["single"]), **records_of(runs["multi"])}
    fates = {**st_model.fate, **mt_model.fate}
    assert set(recs) == set(fates)
    for i, rec in recs.items():
        assert bool(rec.get("error")) == (fates[i] == "fail"), (i, fates[i], rec.get("error"))
        if rec.get("error"):
            assert rec["error_kind"] == "model" and "InternalServerError" in rec["error"], rec["error"]  # the cause, kept
    # Failures where BFCL would have read "no call" as a pass, on both irrelevance categories.
    for cat in IRRELEVANCE:
        assert any(recs[i].get("error") and recs[i]["info"]["category"] == cat for i in recs), cat

    # `sandgym bfcl evaluate`: BFCL's CLI in a sandbox, compared entry by entry.
    keep = tmp_path / "keep"
    ours = _sandgym("bfcl", "evaluate", str(runs["single"]), str(runs["multi"]), "--keep", str(keep), "--json")
    assert ours.returncode == 0, ours.stderr[-3000:]
    rows = {r["category"]: r for r in json.loads(ours.stdout.strip().splitlines()[-1])["rows"]}
    assert set(rows) == set(data.SINGLE_TURN_CATEGORIES + data.MULTI_TURN_CATEGORIES)
    for cat, row in rows.items():
        mine = [r for r in recs.values() if r["info"]["category"] == cat]
        assert row["failed"] == sum(bool(r.get("error")) for r in mine) and row["n"] == len(mine) - row["failed"], row
        assert row["agree"] and not row["differ"], row

    # BFCL's own `bfcl evaluate`, run by hand on `sandgym bfcl export`'s files, as the
    # export command says: its score files give every verdict.
    root = tmp_path / "bfcl"
    exported = _sandgym("bfcl", "export", str(runs["single"]), str(runs["multi"]), "-o", str(root))
    assert exported.returncode == 0 and "failed rollouts left out" in exported.stdout, exported.stderr[-3000:]
    cats = sorted({r["info"]["category"] for r in recs.values() if not r.get("error")})
    docker = shutil.which("docker")
    assert docker, "the docker CLI runs BFCL's image"
    theirs = subprocess.run(
        [docker, "run", "--rm", "--network", "none", "--user", "root", "-v", f"{root}:/tmp/bfcl", "-w", "/tmp/bfcl",
         "-e", "OPENAI_API_KEY=unused-by-evaluation", data.BFCL_IMAGE,
         "bfcl", "evaluate", "--model", data.BFCL_MODEL, "--test-category", ",".join(cats), "--partial-eval"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert theirs.returncode == 0, (theirs.stdout + theirs.stderr)[-3000:]
    for cat in cats:
        (correct, total), wrong = read_score_file((root / score_path(cat)).read_text())
        mine = [r for r in recs.values() if r["info"]["category"] == cat]
        ran = [r for r in mine if not r.get("error")]
        assert total == len(ran), cat  # the failed rollouts are in neither count
        for r in ran:  # every entry: sandgym's verdict is BFCL's
            assert (r["reward"] >= 1.0) == (r["info"]["id"] not in wrong), (cat, r["info"]["id"], r["reward"])
        assert correct == sum(r["reward"] >= 1.0 for r in ran) == rows[cat]["bfcl_correct"] == rows[cat]["sandgym_correct"]
    # The policy was right and wrong, so agreeing means something.
    assert {r["reward"] for r in recs.values() if not r.get("error")} == {0.0, 1.0}
