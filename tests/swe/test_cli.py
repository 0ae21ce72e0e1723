"""`sandgym swe debug` as a user runs it: a subprocess, JSON on stdout, the report on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_docker

pytestmark = pytest.mark.docker


def _swe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandgym", "swe", *args], capture_output=True, text=True, timeout=900)


def test_debug_gold_patch_json_and_broken_report(bundled_dir: Path, tmp_path: Path) -> None:
    require_docker()
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
    proc = _swe("debug", str(bundled_dir / "tasks.jsonl"), "-i", "romanize__subtractive-broken-gold", "--fail-on-unresolved")
    assert proc.returncode == 1


def test_debug_step_none_and_bad_input(bundled_dir: Path, tmp_path: Path) -> None:
    require_docker()
    proc = _swe("debug", str(bundled_dir / "tasks-good.jsonl"), "--step", "none", "--json")
    assert proc.returncode == 0, proc.stderr
    summ = json.loads(proc.stdout)
    assert summ["total"] == 4 and summ["resolved"] == 0 and summ["unresolved"] == 4
    assert all(not i["resolved"] for i in summ["instances"])
    proc = _swe("debug", str(bundled_dir / "tasks.jsonl"), "--step", "bogus")
    assert proc.returncode == 2 and "unknown step" in proc.stderr
    proc = _swe("debug", str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and "cannot load tasks" in proc.stderr
