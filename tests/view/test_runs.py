"""Which run a folder holds and what the viewer reads from it, without a browser: folders
written by the writers' own code (RunFolder, RunStore, validation_summary)."""

from __future__ import annotations

import json
from pathlib import Path

from sandgym.run_folder import RunFolder
from sandgym.swe.store import RunStore
from sandgym.swe.validate import InstanceValidation, validation_summary
from sandgym.view.runs import BFCLRun, EvalRun, SWERun, kind_of

COIN = "tests/test_coin.py::test_coin"


def line(key: str, step: str, status: str, coin: str) -> dict[str, object]:
    return {"instance_id": key.split("/")[0], "step": step, "status": status, "resolved": status == "resolved",
            "fail_to_pass": {}, "pass_to_pass": {COIN: coin}}


def validate_run(root: Path) -> None:
    """A validation of one instance, two runs of each step; the coin test flips between the
    gold runs; the first empty run failed for the environment and was run again."""
    store = RunStore(root)
    store.start({"kind": "validate", "step": "gold+none", "runs": 2})
    store.save("a__b-1/gold_patch-1", line("a__b-1/gold_patch-1", "gold_patch", "resolved", "passed"), {"tests": "1\n"})
    store.save("a__b-1/gold_patch-2", line("a__b-1/gold_patch-2", "gold_patch", "resolved", "failed"), {"tests": "2\n"}, diff="+x\n")
    store.save("a__b-1/none-1", line("a__b-1/none-1", "none", "infra", "passed"), {"tests": "3\n"})
    store.save("a__b-1/none-1", line("a__b-1/none-1", "none", "unresolved", "passed"), {"tests": "3 again\n"})
    store.save("a__b-1/none-2", line("a__b-1/none-2", "none", "unresolved", "passed"), {"tests": "4\n"})
    store.close()
    verdict = InstanceValidation(instance_id="a__b-1", runs=2, gold_resolved=2, flaky_listed=[COIN], verdict="invalid",
                                 problems=["flaky listed tests"])
    store.write_summary(validation_summary([verdict], 2, 1.5))  # as `sandgym swe validate` ends


def test_swe_runs_are_told_apart_by_their_meta(tmp_path: Path) -> None:
    validate_run(tmp_path / "validate")
    debug = RunStore(tmp_path / "debug")
    debug.start({"kind": "debug", "step": "gold_patch"})
    debug.save("c__d-1", {"instance_id": "c__d-1", "step": "gold_patch", "status": "resolved"}, {"tests": "ok\n"})
    debug.close()
    assert kind_of(tmp_path / "validate") is SWERun and kind_of(tmp_path / "debug") is SWERun

    v = SWERun("0/validate", tmp_path / "validate")
    card = v.card()
    assert card["mode"] == "validate" and card["status"] == "finished" and card["valid"] == 0
    assert card["runs"] == 4 and card["statuses"] == {"resolved": 2, "unresolved": 2}  # the superseded infra line is gone
    [inst] = v.detail()["validation"]
    assert inst["verdict"] == "invalid" and inst["problems"] == ["flaky listed tests"] and inst["flaky"] == [COIN]
    page = v.instance("a__b-1/gold_patch-2")
    assert [f["name"] for f in page["files"]] == ["applied.diff", "tests.log"] and page["flaky"] == [COIN]
    assert v.file(page["files"][1]["path"], 0, 100)["value"] == "2\n"

    d = SWERun("0/debug", tmp_path / "debug")
    assert d.card()["mode"] == "debug" and d.card()["valid"] is None and "validation" not in d.detail()
    assert d.instance("c__d-1")["result"]["status"] == "resolved"
    assert d.card()["status"] != "finished"  # no summary yet: the run was killed, or is still going


def test_eval_runs_old_and_new(tmp_path: Path) -> None:
    for name, env in (("echo", "echo"), ("bfcl", "bfcl_v4_single_turn")):
        f = RunFolder(tmp_path / name, kind="eval", identity=("env",))
        f.open({"env": env, "model": "oracle"}, resume=False)
        f.close()
    assert kind_of(tmp_path / "echo") is EvalRun and kind_of(tmp_path / "bfcl") is BFCLRun
    assert EvalRun("0/echo", tmp_path / "echo").meta()["kind"] == "eval"
    old = tmp_path / "old"  # an eval of an older sandgym: a meta without a kind
    old.mkdir()
    (old / "meta.json").write_text(json.dumps({"env": "echo", "model": "null"}))
    assert kind_of(old) is EvalRun
    assert kind_of(tmp_path) is None
