"""How a gold patch goes on, as SWE-bench's harness does it, on small local repositories:
one that does not apply is an `error` with git's message and no test run; one whose
context drifted goes on through `patch --fuzz`, recorded in the result and shown; one cut
short mid-hunk is refused whole (the fallback would apply its first hunks and fuzz the torn
one); and validation says why a gold patch does not resolve its task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.swe.bundled import init_repo
from sandgym.swe.patches import cut_short
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "# the value module\ndef value():\n    return 1\n# end\n"
OTHER = "def other():\n    return 'a'\n"
TESTS = "from pkg import value\n\ndef test_value():\n    assert value() == 2\n\ndef test_keep():\n    assert True\n"


def _diff(path: str, old: str, new: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n" + old + new


EXACT = _diff("pkg/__init__.py", "@@ -1,4 +1,4 @@\n # the value module\n def value():\n", "-    return 1\n+    return 2\n # end\n")
# Written against a copy whose first line differs: git refuses, patch applies it with fuzz.
DRIFTED = EXACT.replace(" # the value module\n", " # the values module, v2\n")
# Removes a line the file does not have: nothing applies it.
WRONG = EXACT.replace("-    return 1\n", "-    return 7\n")
# The fix and a second file's hunk, cut off in that hunk (a truncated download, say).
TWO = EXACT + _diff("pkg/other.py", "@@ -1,2 +1,2 @@\n def other():\n", "-    return 'a'\n+    return 'b'\n")
TORN = TWO[: TWO.index("+    return 'b'")]


def _rows(tmp: Path, patches: dict[str, str]) -> Path:
    rows = []
    for iid, patch in patches.items():
        src = tmp / "src" / iid
        (src / "pkg").mkdir(parents=True)
        (src / "tests").mkdir()
        (src / "pkg" / "__init__.py").write_text(SOURCE)
        (src / "pkg" / "other.py").write_text(OTHER)
        (src / "tests" / "test_v.py").write_text(TESTS)
        commit = init_repo(src, tmp / "repos" / iid)
        rows.append({"instance_id": iid, "repo": "local/patches", "base_commit": commit, "patch": patch,
                     "repo_path": str(tmp / "repos" / iid), "FAIL_TO_PASS": json.dumps(["tests/test_v.py::test_value"]),
                     "PASS_TO_PASS": json.dumps(["tests/test_v.py::test_keep"]),
                     "recipe": {"pip": ["pytest==8.3.4"], "history": "shallow"}})
    path = tmp / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _swe(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "sandgym", "swe", *args], capture_output=True, text=True, timeout=1200, env=env)


def test_a_torn_hunk_is_found_in_the_patch_text() -> None:
    assert cut_short(EXACT) == [] and cut_short(TWO) == []
    assert cut_short(TORN) == ["hunk 1 of pkg/other.py has 2 of its 2 old and 1 of its 2 new lines"]


@pytest.mark.docker
def test_gold_patches_that_do_not_apply_drift_or_are_cut_short(tmp_path: Path) -> None:
    require("docker")
    rows = _rows(tmp_path, {"p__exact-1": EXACT, "p__drifted-2": DRIFTED, "p__wrong-3": WRONG, "p__torn-4": TORN})
    out = tmp_path / "run"
    proc = _swe("debug", str(rows), "-c", "2", "--json", "-o", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]  # two errors
    summ = json.loads(proc.stdout)
    res = {i: json.loads((out / i / "result.json").read_text()) for i in ("p__exact-1", "p__drifted-2", "p__wrong-3", "p__torn-4")}

    exact = res["p__exact-1"]
    assert exact["status"] == "resolved" and exact["patches"]["gold"]["method"] == "git" and not exact["patches"]["gold"]["fuzzy"]

    drifted = res["p__drifted-2"]
    assert drifted["status"] == "resolved", drifted
    gold = drifted["patches"]["gold"]
    assert gold["method"] == "patch" and gold["fuzzy"] and "with fuzz" in gold["fuzzy"][0], gold
    assert "patch failed" in gold["git_error"] or "does not apply" in gold["git_error"], gold
    assert summ["fuzzy_applies"][0]["instance_id"] == "p__drifted-2"
    shown = " ".join(proc.stderr.split())
    assert "fuzzy p__drifted-2: the gold patch applied by patch --fuzz=5 after git apply refused it" in shown, proc.stderr[-3000:]

    wrong = res["p__wrong-3"]
    assert wrong["status"] == "error" and wrong["error"].startswith("the gold patch does not apply: git apply: error: patch failed: pkg/__init__.py:1"), wrong["error"]
    assert "nothing was applied" in wrong["error"]
    # SWE-bench's behavior: no test run, nothing in the tree.
    assert wrong["tests"] == {} and wrong["test_exit_code"] is None and wrong["applied_diff"] == ""
    assert not (out / "p__wrong-3" / "tests.log").exists()

    torn = res["p__torn-4"]
    assert torn["status"] == "error" and "the patch is corrupt (cut short?): hunk 1 of pkg/other.py" in torn["error"], torn["error"]
    assert torn["applied_diff"] == "" and torn["tests"] == {}  # the complete first file was not applied either
    assert "--dry-run" not in (out / "p__torn-4" / "step.log").read_text()  # never given to the fuzzy fallback

    broken = {b["instance_id"]: b for b in summ["not_resolved"]}
    assert set(broken) == {"p__wrong-3", "p__torn-4"}
    assert "p__wrong-3 (error): the gold patch does not apply: git apply: error: patch failed" in shown


@pytest.mark.docker
def test_validation_says_why_the_gold_patch_does_not_resolve(tmp_path: Path) -> None:
    require("docker")
    rows = _rows(tmp_path, {"v__wrong-1": WRONG})
    out = tmp_path / "val"
    proc = _swe("validate", str(rows), "--runs", "1", "--json", "-o", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    (inst,) = json.loads(proc.stdout)["instances"]
    assert inst["verdict"] == "invalid" and inst["gold_errors"][0].startswith("the gold patch does not apply: git apply: error: patch failed")
    problem = next(p for p in inst["problems"] if p.startswith("gold resolved 0/1 runs"))
    assert "the gold patch does not apply: git apply: error: patch failed: pkg/__init__.py:1" in problem, problem
    assert "the gold patch does not apply" in " ".join(proc.stderr.split())
