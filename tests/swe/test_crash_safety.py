"""Results are never lost: test ids that are invalid rich markup are shown as text, a run
killed with SIGKILL mid-way leaves every finished instance whole on disk and `--resume`
finishes the rest without re-running them, and a harness crash in one instance marks
that instance only. The tasks are small local repositories (no mirror, no network)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from sandgym.swe.bundled import init_repo
from sandgym.swe.store import RunStore, safe_name
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
TEST_FILE = '''import time
import pytest
from pkg import value

@pytest.mark.parametrize("p", ["/n/fs/x", "red", "[bold]x"])
def test_path(p):
    time.sleep({sleep})
    assert value() == 2

def test_keep():
    assert True
'''
GOLD = """diff --git a/pkg/__init__.py b/pkg/__init__.py
--- a/pkg/__init__.py
+++ b/pkg/__init__.py
@@ -1,2 +1,2 @@
 def value():
-    return 1
+    return 2
"""
F2P = ["tests/test_m.py::test_path[/n/fs/x]", "tests/test_m.py::test_path[red]", "tests/test_m.py::test_path[[bold]x]"]


def _rows(tmp: Path, ids_and_sleeps: list[tuple[str, float]], **extra: object) -> Path:
    rows = []
    for iid, sleep in ids_and_sleeps:
        src = tmp / "src" / safe_name(iid)
        (src / "pkg").mkdir(parents=True)
        (src / "tests").mkdir()
        (src / "pkg" / "__init__.py").write_text("def value():\n    return 1\n")
        (src / "tests" / "test_m.py").write_text(TEST_FILE.format(sleep=sleep))
        commit = init_repo(src, tmp / "repos" / safe_name(iid))
        rows.append({"instance_id": iid, "repo": "local/markup", "base_commit": commit, "patch": GOLD,
                     "repo_path": str(tmp / "repos" / safe_name(iid)), "FAIL_TO_PASS": json.dumps(F2P),
                     "PASS_TO_PASS": json.dumps(["tests/test_m.py::test_keep"]),
                     # The same env layer as the bundled tasks: built once, shared.
                     "recipe": {"pip": ["pytest==8.3.4"], "history": "shallow"}, **extra})
    path = tmp / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "sandgym", "swe", "debug", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def test_rendering_never_reads_data_as_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandgym.cli import swe_cmd

    rec = Console(record=True, width=200)
    monkeypatch.setattr(swe_cmd, "console", rec)
    rows = [{"instance_id": "x__[/n/fs/x]-1", "status": "unresolved", "resolved": False, "error": "boom [/bold] [red]",
             "failing_tests": ["t.py::test_cache[/n/fs/x]"], "fail_to_pass": {"t.py::test_cache[/n/fs/x]": "failed"},
             "pass_to_pass": {"t.py::test_[red]": "passed"}, "timings": {"total_s": 1.0}}]
    swe_cmd._render(rows, "gold_patch", verbose=True)  # a MarkupError here lost a whole run before
    out = rec.export_text()
    for text in ("x__[/n/fs/x]-1", "t.py::test_cache[/n/fs/x]", "t.py::test_[red]", "boom [/bold] [red]"):
        assert text in out


@pytest.mark.docker
def test_markup_ids_through_the_cli(tmp_path: Path) -> None:
    require("docker")
    rows = _rows(tmp_path, [("markup__ids-1", 0)])
    out = tmp_path / "run"
    p = _cli(str(rows), "-o", str(out), "--json", "-v")
    stdout, stderr = p.communicate(timeout=900)
    assert p.returncode == 0, stderr[-3000:]
    summ = json.loads(stdout)
    assert summ["resolved"] == 1 and summ["total"] == 1
    for tid in F2P:  # shown as text in the per-test table
        assert tid in stderr
    res = json.loads((out / "markup__ids-1" / "result.json").read_text())
    assert res["status"] == "resolved" and set(res["fail_to_pass"]) == set(F2P)
    assert all(v == "passed" for v in res["fail_to_pass"].values())
    assert (out / "markup__ids-1" / "tests.log").read_text().count(">>>>> End Test Output") == 1
    assert "git apply" in (out / "markup__ids-1" / "step.log").read_text()  # the patch-apply log
    assert json.loads((out / "summary.json").read_text())["resolved"] == 1


@pytest.mark.docker
def test_killed_run_keeps_finished_instances_and_resumes(tmp_path: Path) -> None:
    require("docker")
    from sandgym.sandboxes import get_provider, prune

    # The first instance finishes at once; each later one sleeps 3 x 2 s in its tests, so
    # the kill (as soon as the first result is on disk) lands while the second runs.
    ids = [("kill__fast-1", 0), ("kill__slow-2", 2), ("kill__[red]-3", 2), ("kill__[/n/fs/x]-4", 2)]
    rows = _rows(tmp_path, ids)
    out = tmp_path / "run"
    p = _cli(str(rows), "-o", str(out), "-c", "1", start_new_session=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 900
    while not (results.exists() and results.read_text().strip()):
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no instance finished"
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    anyio.run(prune, get_provider("docker"))  # the killed run's sandbox

    store = RunStore(out)
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    finished = store.finished(i for i, _ in ids)
    assert {x["key"] for x in lines} == set(finished), "every line written has its result on disk, and no more"
    assert 1 <= len(finished) < len(ids)
    for key, res in finished.items():
        assert res["status"] == "resolved", res
        assert (store.dir_for(key) / "tests.log").read_text().rstrip().endswith(">>>>> End Test Output")  # whole
    before = {k: (store.dir_for(k) / "result.json").stat().st_mtime_ns for k in finished}

    p = _cli(str(rows), "--resume", str(out), "-c", "2", "--json")
    stdout, stderr = p.communicate(timeout=900)
    assert p.returncode == 0, stderr[-3000:]
    assert json.loads(stdout)["resolved"] == len(ids)
    assert f"{len(finished)} finished, {len(ids) - len(finished)} to run" in " ".join(stderr.split())
    after = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted(x["key"] for x in after) == sorted(i for i, _ in ids)  # none ran twice
    for k, mtime in before.items():
        assert (store.dir_for(k) / "result.json").stat().st_mtime_ns == mtime
    assert all(store.load(i)["status"] == "resolved" for i, _ in ids)  # type: ignore[index]


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_crash_marks_only_its_instance(tmp_path: Path) -> None:
    """A log parser that raises (here `json:loads` on pytest output) is a real harness
    crash: that instance is `infra` / `crash` with the traceback on disk; the other resolves."""
    require("docker")
    from sandgym.sandboxes.manager import SandboxManager
    from sandgym.swe.debug import SWEDebugRunner
    from sandgym.swe.tasks import load_tasks

    rows = _rows(tmp_path, [("crash__ok-1", 0)])
    (good,) = load_tasks(rows)
    bad = good.model_copy(update={"instance_id": "crash__parser-2",
                                  "recipe": good.recipe.model_copy(update={"log_parser": "json:loads"})})  # type: ignore[union-attr]
    store = RunStore(tmp_path / "run")
    store.start({"kind": "debug", "step": "gold_patch"})
    async with SandboxManager("docker", max_sandboxes=2) as mgr:
        results = {r.instance_id: r for r in await SWEDebugRunner(mgr, store=store).run([good, bad], concurrency=2)}
        assert mgr.live == 0
    assert results["crash__ok-1"].status == "resolved"
    crashed = results["crash__parser-2"]
    assert crashed.status == "infra" and crashed.infra_reason == "crash" and "JSONDecodeError" in (crashed.error or "")
    assert "Traceback" in (store.dir_for("crash__parser-2") / "crash.log").read_text()
    assert (store.dir_for("crash__parser-2") / "tests.log").exists()  # what ran before the crash is kept
