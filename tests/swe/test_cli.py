"""`sandgym swe debug` as a user runs it: a subprocess, JSON on stdout, the report on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.docker


def _swe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandgym", "swe", *args], capture_output=True, text=True, timeout=900)


def test_debug_gold_patch_json_and_broken_report(bundled_dir: Path, tmp_path: Path) -> None:
    require("docker")
    out = tmp_path / "run"
    proc = _swe("debug", str(bundled_dir / "tasks.jsonl"), "--step", "gold_patch", "-c", "2", "--json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    summ = json.loads(proc.stdout)
    per = {i["instance_id"]: i["resolved"] for i in summ["instances"]}
    assert per == {"intervals__touching": True, "lrucache__get-refreshes": True, "slugger__collapse-runs": True,
                   "statskit__median-even": True, "romanize__subtractive-broken-gold": False}
    assert summ["not_resolved"][0]["failing_tests"] == ["tests/test_roman.py::test_subtractive_tens"]
    assert "whose gold patch does not resolve them" in proc.stderr
    assert "romanize__subtractive-broken-gold (unresolved): tests/test_roman.py::test_subtractive_tens" in proc.stderr
    assert "4/5 resolved" in proc.stderr
    # Kept: the summary, and per instance the result, the applied diff and the logs.
    assert json.loads((out / "summary.json").read_text())["resolved"] == 4
    inst = out / "statskit__median-even"
    assert "median" in (inst / "applied.diff").read_text()
    assert "test_median_even PASSED" in (inst / "tests.log").read_text() or "PASSED tests/test_core.py::test_median_even" in (inst / "tests.log").read_text()
    # --fail-on-unresolved turns the broken task into a failing exit status.
    proc = _swe("debug", str(bundled_dir / "tasks.jsonl"), "-i", "romanize__subtractive-broken-gold", "--fail-on-unresolved",
                "-o", str(tmp_path / "run2"))
    assert proc.returncode == 1
    # The same directory again without --resume is refused; with it, nothing is left to run.
    proc = _swe("debug", str(bundled_dir / "tasks.jsonl"), "-o", str(out))
    assert proc.returncode == 2 and "--resume" in proc.stderr
    proc = _swe("debug", str(bundled_dir / "tasks.jsonl"), "--resume", str(out), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["resolved"] == 4
    assert "5 finished, 0 to run" in " ".join(proc.stderr.split())


def test_debug_step_none_and_bad_input(bundled_dir: Path, tmp_path: Path) -> None:
    require("docker")
    proc = _swe("debug", str(bundled_dir / "tasks-good.jsonl"), "--step", "none", "--json", "-o", str(tmp_path / "none"))
    assert proc.returncode == 0, proc.stderr
    summ = json.loads(proc.stdout)
    assert summ["total"] == 4 and summ["resolved"] == 0 and summ["unresolved"] == 4
    assert all(not i["resolved"] for i in summ["instances"])
    proc = _swe("debug", str(bundled_dir / "tasks.jsonl"), "--step", "bogus")
    assert proc.returncode == 2 and "unknown step" in proc.stderr
    proc = _swe("debug", str(tmp_path / "missing.jsonl"))  # a path, not a hub name: said at once
    assert proc.returncode == 2 and "cannot load tasks" in proc.stderr and "no such file or directory" in proc.stderr, proc.stderr
    assert "Hugging Face hub" not in proc.stderr


def test_validate_flags_the_broken_task(bundled_dir: Path, tmp_path: Path) -> None:
    """Gold and empty patch, two runs each: the good task is valid; the broken one is not,
    and the table says why (its gold patch fails a named test in every run)."""
    require("docker")
    out = tmp_path / "val"
    proc = _swe("validate", str(bundled_dir / "tasks.jsonl"), "-i", "statskit__median-even",
                "-i", "romanize__subtractive-broken-gold", "--runs", "2", "-o", str(out), "--json")
    assert proc.returncode == 1, proc.stderr  # not every task is valid
    summ = json.loads(proc.stdout)
    vals = {v["instance_id"]: v for v in summ["instances"]}
    good, broken = vals["statskit__median-even"], vals["romanize__subtractive-broken-gold"]
    assert good["verdict"] == "valid" and good["gold_resolved"] == 2 and good["empty_resolved"] == 0 and good["runs"] == 2
    assert good["flaky_listed"] == [] and good["cold_s"] is None or good["cold_s"] > 0
    assert good["gold_warm_s"] is not None and good["empty_warm_s"] is not None
    assert broken["verdict"] == "invalid" and broken["gold_resolved"] == 0
    assert broken["gold_failing"] == ["tests/test_roman.py::test_subtractive_tens"]
    assert "1/2 valid" in proc.stderr and "gold resolved 0/2 runs" in " ".join(proc.stderr.split())
    for k in (1, 2):  # every run on disk, keyed instance/step-k
        for step in ("gold_patch", "none"):
            assert (out / "statskit__median-even" / f"{step}-{k}" / "result.json").exists()
    assert json.loads((out / "summary.json").read_text())["valid"] == 1
    # Resumed: nothing runs again, the verdicts are the same.
    proc = _swe("validate", str(bundled_dir / "tasks.jsonl"), "-i", "statskit__median-even",
                "-i", "romanize__subtractive-broken-gold", "--runs", "2", "--resume", str(out), "--json")
    assert json.loads(proc.stdout)["valid"] == 1
    assert len((out / "results.jsonl").read_text().splitlines()) == 8


def test_network_rows_need_an_allow_list(bundled_dir: Path, tmp_path: Path) -> None:
    # (prebuilt images: tests/swe/test_prebuilt.py, against a registry on 127.0.0.1)
    require("docker")
    row = json.loads((bundled_dir / "tasks.jsonl").read_text().splitlines()[0])
    (tmp_path / "net.jsonl").write_text(json.dumps({**row, "network": True}) + "\n")
    proc = _swe("debug", str(tmp_path / "net.jsonl"), "--json", "-o", str(tmp_path / "net"))
    (inst,) = json.loads(proc.stdout)["instances"]
    assert proc.returncode == 1 and inst["status"] == "error" and "--network-allow" in inst["error"]
    # A bad allow-list entry: one line naming the option, exit 2, nothing run.
    proc = _swe("debug", str(tmp_path / "net.jsonl"), "--network-allow", "http://x y", "-o", str(tmp_path / "bad"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--network-allow: egress entry" in proc.stderr
    assert not (tmp_path / "bad").exists()
