"""Task loading (JSONL, Hugging Face datasets, SWE-bench's JSON-string test lists), the
bundled task builder, and the unified-diff model checked against real `git apply`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sandgym.swe.bundled import BROKEN, instance_ids, load_bundled
from sandgym.swe.patches import apply_hunks, parse_patch
from sandgym.swe.tasks import Recipe, SWETask, diff_files, load_tasks


def _row(**kw: object) -> dict[str, object]:
    row: dict[str, object] = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc1234", "patch": "", "test_patch": ""}
    row.update(kw)
    return row


def test_swebench_strings_and_flat_recipe_keys(tmp_path: Path) -> None:
    rows = [
        _row(FAIL_TO_PASS='["t::a"]', PASS_TO_PASS="[]", test_cmd="python -m unittest -v", pip=["x==1"], python="3.11",
             repo_path="repos/r"),
        _row(instance_id="o__r-2", recipe={"install": "pip install -e ."}, FAIL_TO_PASS=["t::b"]),
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    tasks = load_tasks(path)
    assert tasks[0].FAIL_TO_PASS == ["t::a"] and tasks[0].PASS_TO_PASS == []
    assert tasks[0].recipe.test_cmd == "python -m unittest -v" and tasks[0].recipe.pip == ("x==1",)
    assert tasks[0].recipe.framework() == "unittest"
    assert tasks[0].repo_path == str((tmp_path / "repos" / "r").resolve())  # relative to the JSONL
    assert tasks[1].recipe.install == ("pip install -e .",) and tasks[1].recipe.framework() == "pytest"
    assert [t.instance_id for t in load_tasks(path, instance_ids=["o__r-2"])] == ["o__r-2"]
    with pytest.raises(KeyError, match="nope"):
        load_tasks(path, instance_ids=["nope"])


def test_bad_input_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row()) + "\n{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_tasks(path)
    with pytest.raises(ValueError, match="duplicate"):
        load_tasks([_row(), _row()])
    with pytest.raises(ValueError, match="JSON list"):
        SWETask.model_validate(_row(FAIL_TO_PASS="t::a"))
    with pytest.raises(FileNotFoundError, match="SANDGYM_SWE_MIRRORS"):
        SWETask.model_validate(_row(repo_path=str(tmp_path / "missing"))).find_repo()


def test_hugging_face_dataset_and_mirrors(tmp_path: Path) -> None:
    from datasets import Dataset

    ds = Dataset.from_list([_row(FAIL_TO_PASS='["a"]', PASS_TO_PASS='["b"]')])
    (task,) = load_tasks(ds)
    assert task.FAIL_TO_PASS == ["a"] and task.PASS_TO_PASS == ["b"] and task.recipe == Recipe()
    ds.save_to_disk(str(tmp_path / "ds"))
    assert load_tasks(str(tmp_path / "ds"))[0].FAIL_TO_PASS == ["a"]
    from datasets import DatasetDict

    DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "dd"))
    assert load_tasks(tmp_path / "dd", split="test")[0].PASS_TO_PASS == ["b"]
    ds.to_json(str(tmp_path / "swe.jsonl"))  # the JSONL SWE-bench ships, lists as JSON strings
    assert load_tasks(tmp_path / "swe.jsonl")[0].FAIL_TO_PASS == ["a"]
    (mirror := tmp_path / "mirrors" / "o__r.git").mkdir(parents=True)
    assert task.find_repo(tmp_path / "mirrors") == mirror


def test_test_command_uses_the_test_patch_files() -> None:
    tp = "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1 @@\n-a\n+b\n"
    t = SWETask.model_validate(_row(test_patch=tp))
    assert t.test_files == ["tests/test_x.py"]
    assert t.test_command() == "python -m pytest -rA -p no:cacheprovider tests/test_x.py"
    assert diff_files("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n") == ["x.py"]


def test_bundled_tasks_are_deterministic_git_repos(tmp_path: Path, bundled_dir: Path) -> None:
    again = {t.instance_id: t for t in load_bundled(tmp_path)}
    first = {t.instance_id: t for t in load_tasks(bundled_dir / "tasks.jsonl")}
    assert set(again) == set(first) == set(instance_ids()) and len(first) == 5
    assert set(BROKEN) <= set(first)
    for iid, t in first.items():
        assert again[iid].base_commit == t.base_commit  # fixed author/dates: same commit anywhere
        head = subprocess.run(["git", "-C", t.repo_path, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert head == t.base_commit
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and t.patch and t.test_patch
    good = load_tasks(bundled_dir / "tasks-good.jsonl")
    assert {t.instance_id for t in good} == set(first) - set(BROKEN)
    assert {t.recipe.framework() for t in good} == {"pytest", "unittest"}


@pytest.mark.parametrize("which", ["patch", "test_patch"])
def test_patch_model_matches_git_apply(tmp_path: Path, bundled: dict[str, SWETask], which: str) -> None:
    for iid, task in bundled.items():
        work = tmp_path / which / iid
        subprocess.run(["git", "clone", "-q", task.repo_path or "", str(work)], check=True)
        diff = getattr(task, which)
        ours = {}
        for fp in parse_patch(diff):
            before = (work / fp.old_path).read_text() if fp.old_path else ""
            ours[fp.path] = apply_hunks(before, fp)
        subprocess.run(["git", "apply", "-"], cwd=work, input=diff, text=True, check=True)
        for path, text in ours.items():
            assert (work / path).read_text() == text, (iid, path)


def test_no_newline_at_end_of_file(tmp_path: Path) -> None:
    for a, b in (("x\ny\nz", "x\nY\nz"), ("x\ny\nz", "x\ny\nz\n"), ("x\ny\nz\n", "x\ny\nz"), ("", "new\nfile")):
        (tmp_path / "a").write_text(a)
        (tmp_path / "b").write_text(b)
        diff = subprocess.run(["git", "diff", "--no-index", "a", "b"], cwd=tmp_path, capture_output=True, text=True).stdout
        (fp,) = parse_patch(diff)
        assert apply_hunks(a, fp) == b
