"""One run folder for every run (sandgym.run_folder): the record log's repair and
replacement rules, the same-run rule as eval, Ray eval and SWE runs apply it, and the exact
refusal `sandgym eval --resume` gives on one machine and with `--ray`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.errors import UserError
from sandgym.run_folder import (
    META,
    RESULTS,
    SUMMARY,
    RecordLog,
    RunFolder,
    RunMismatchError,
    read_meta,
    read_summary,
    unit_key,
)
from sandgym.swe.store import RunStore

ROOT = Path(__file__).resolve().parents[2]


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "sandgym", "eval", *args], capture_output=True, text=True, timeout=300, env=env)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_the_last_record_of_a_key_wins_and_torn_lines_go(tmp_path: Path) -> None:
    path = tmp_path / RESULTS
    log = RecordLog(path, key=unit_key)
    assert log.append({"key": "a", "status": "infra"})
    assert not log.append({"key": "a", "status": "resolved"})  # recorded already: ignored
    assert log.append({"key": "a", "status": "resolved"}, replace=True)  # a run again supersedes it
    assert log.append({"key": "b", "status": "unresolved"})
    log.close()
    with open(path, "a") as f:
        f.write('{"key": "c", "sta')  # a crash mid-write
    again = RecordLog(path, key=unit_key)
    assert {k: r["status"] for k, r in again.records.items()} == {"a": "resolved", "b": "unresolved"}
    again.close()
    # Repaired on reopening: one line per key, the torn one gone.
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["a", "b"]


def test_the_same_run_rule_and_resume(tmp_path: Path) -> None:
    d = tmp_path / "run"
    first = RunFolder(d, kind="eval", identity=("env", "model"))
    meta = first.open({"env": "echo", "model": "oracle", "num_examples": 2}, resume=False)
    first.append({"example_id": 0, "rollout_index": 0, "reward": 1.0})
    first.close()
    assert meta["kind"] == "eval" and "started" in meta
    with pytest.raises(UserError, match="already holds a run; use --resume"):
        RunFolder(d, kind="eval", identity=("env", "model")).check({"env": "echo", "model": "oracle"}, resume=False)
    with pytest.raises(UserError, match="nothing to resume"):
        RunFolder(tmp_path / "empty", kind="eval").check({}, resume=True)
    with pytest.raises(RunMismatchError, match=r"holds another run \(model: 'oracle', now 'null'\)"):
        RunFolder(d, kind="eval", identity=("env", "model")).check({"env": "echo", "model": "null"}, resume=True)
    with pytest.raises(RunMismatchError, match=r"\(kind: 'eval', now 'debug'\)"):
        RunFolder(d, kind="debug", identity=("step",)).check({"step": "none"}, resume=True)
    # A run killed before its first record left only its meta: a fresh run over it loses nothing.
    bare = RunFolder(tmp_path / "bare", kind="eval", identity=("env", "model"))
    bare.open({"env": "echo", "model": "oracle"}, resume=False)
    bare.close()
    fresh = RunFolder(tmp_path / "bare", kind="eval", identity=("env", "model"))
    assert fresh.open({"env": "echo", "model": "null"}, resume=False)["model"] == "null"
    fresh.close()
    # More examples extend the run: not part of its identity.
    again = RunFolder(d, kind="eval", identity=("env", "model"))
    doc = again.open({"env": "echo", "model": "oracle", "num_examples": 5}, resume=True)
    assert again.done() == {(0, 0)}
    again.close()
    assert doc["started"] == meta["started"] and len(doc["resumed"]) == 1 and doc["num_examples"] == 5


def test_swe_runs_follow_the_same_rule_and_read_an_older_folder(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "swe")
    store.start({"kind": "debug", "step": "gold_patch"})
    store.save("x__y-1", {"instance_id": "x__y-1", "status": "infra"}, {"setup": "log\n"})
    store.save("x__y-1", {"instance_id": "x__y-1", "status": "resolved"}, {"setup": "log\n"})  # --retry-infra
    store.close()
    assert RunStore(tmp_path / "swe").finished(["x__y-1", "x__y-2"]) == {"x__y-1": {"instance_id": "x__y-1", "status": "resolved"}}
    with pytest.raises(RunMismatchError, match=r"\(step: 'gold_patch', now 'none'\)"):
        RunStore(tmp_path / "swe").start({"kind": "debug", "step": "none"}, resume=True)


def test_a_swe_run_in_a_relative_folder_keeps_its_instances_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sandgym swe debug -o runs/x` (the CLI's default is relative too): each instance's
    files in runs/x/<instance>/, where a resume and the viewer look for them."""
    monkeypatch.chdir(tmp_path)
    store = RunStore(Path("runs") / "x")
    store.start({"kind": "debug", "step": "gold_patch"})
    d = store.save("x__y-1", {"instance_id": "x__y-1", "status": "resolved"}, {"tests": "ok\n"}, diff="+a\n")
    store.close()
    inst = tmp_path / "runs" / "x" / "x__y-1"
    assert d.resolve() == inst
    assert sorted(p.name for p in inst.iterdir()) == ["applied.diff", "result.json", "tests.log"]
    assert RunStore(Path("runs") / "x").finished(["x__y-1"]) == {"x__y-1": {"instance_id": "x__y-1", "status": "resolved"}}
    folder = RunFolder(Path("runs") / "x", kind="debug")
    for outside in (tmp_path / "elsewhere.txt", Path("..") / "elsewhere.txt"):
        with pytest.raises(ValueError, match="not a path inside the run folder"):
            folder.write_file(outside, "x")
    assert not (tmp_path / "elsewhere.txt").exists() and not (tmp_path / "runs" / "elsewhere.txt").exists()


def test_meta_and_summary_are_read_only_when_whole(tmp_path: Path) -> None:
    """No file, or one that is not a JSON object (torn), reads as none."""
    assert read_meta(tmp_path) is None and read_summary(tmp_path) is None
    (tmp_path / META).write_text(json.dumps({"kind": "validate", "step": "gold+none", "resumed": ["now"]}))
    (tmp_path / SUMMARY).write_text("{torn")
    assert read_meta(tmp_path) == {"kind": "validate", "step": "gold+none", "resumed": ["now"]}
    assert read_summary(tmp_path) is None
    (tmp_path / SUMMARY).write_text(json.dumps({"kind": "validate", "valid": 2}))
    assert read_summary(tmp_path) == {"kind": "validate", "valid": 2}


def test_eval_refuses_another_runs_folder_alike_on_one_machine_and_on_ray(tmp_path: Path) -> None:
    """The folder's rule is checked before anything runs, by run_eval and by
    run_fleet_eval alike, so `--ray` needs no cluster to refuse (nothing listens at
    the address given): the same one line, exit 2."""
    run = tmp_path / "run"
    first = _eval("tool_use", "--policy", "oracle", "-a", "num_tasks=2", "-o", str(run), "--provider", "local")
    assert first.returncode == 0, first.stderr[-3000:]
    n_records = len((run / RESULTS).read_text().splitlines())
    other_policy = ("tool_use", "--policy", "null", "-a", "num_tasks=2", "--resume", str(run))
    local = _eval(*other_policy, "--provider", "local")
    on_ray = _eval(*other_policy, "--ray", "127.0.0.1:9")
    expected = f"error: {run} holds another run (model: 'oracle', now 'null'); resuming would mix them: choose another output folder or remove that one"
    for proc in (local, on_ray):
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert _error_lines(proc.stderr) == [expected], proc.stderr[-3000:]
    other_env = _eval("humaneval", "--policy", "oracle", "--resume", str(run), "--ray", "127.0.0.1:9")
    assert other_env.returncode == 2 and _error_lines(other_env.stderr) == [
        f"error: {run} holds another run (env: 'tool_use', now 'humaneval'); resuming would mix them: choose another output folder or remove that one"
    ], other_env.stderr[-3000:]
    # A fresh run into a folder that holds one, and a resume of a folder that holds none.
    fresh = _eval("tool_use", "--policy", "oracle", "-a", "num_tasks=2", "-o", str(run), "--ray", "127.0.0.1:9")
    assert fresh.returncode == 2 and _error_lines(fresh.stderr) == [
        f"error: {run} already holds a run; use --resume {run} to continue it, or choose another output folder"
    ], fresh.stderr[-3000:]
    nothing = _eval("tool_use", "--policy", "oracle", "--resume", str(tmp_path / "none"), "--provider", "local")
    assert nothing.returncode == 2 and "nothing to resume in" in nothing.stderr
    assert len((run / RESULTS).read_text().splitlines()) == n_records  # nothing was mixed in
