"""Task loading (JSONL, Hugging Face datasets, SWE-bench's JSON-string test lists), the
bundled task builder, and the unified-diff model checked against real `git apply`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sandgym.swe.bundled import BROKEN, instance_ids, load_bundled
from sandgym.swe.patches import apply_hunks, parse_patch
from sandgym.swe.tasks import Recipe, RecipeError, SWETask, diff_files, diff_paths, load_tasks


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
    for missing in (str(tmp_path / "none.jsonl"), "rows.json", "./rows"):  # paths, never hub names
        with pytest.raises(FileNotFoundError, match="no such file or directory"):
            load_tasks(missing)
    with pytest.raises(ValueError, match="JSON list"):
        SWETask.model_validate(_row(FAIL_TO_PASS="t::a"))
    with pytest.raises(FileNotFoundError, match="SANDGYM_SWE_MIRRORS"):
        SWETask.model_validate(_row(repo_path=str(tmp_path / "missing"))).find_repo()


def test_hugging_face_dataset_and_mirrors(tmp_path: Path) -> None:
    from datasets import Dataset

    ds = Dataset.from_list([_row(FAIL_TO_PASS='["a"]', PASS_TO_PASS='["b"]')])
    (task,) = load_tasks(ds)
    # No recipe in the row: none is invented (it is resolved later, or the run says why not).
    assert task.FAIL_TO_PASS == ["a"] and task.PASS_TO_PASS == ["b"] and task.recipe is None
    ds.save_to_disk(str(tmp_path / "ds"))
    assert load_tasks(str(tmp_path / "ds"))[0].FAIL_TO_PASS == ["a"]
    from datasets import DatasetDict

    DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "dd"))
    assert load_tasks(tmp_path / "dd", split="test")[0].PASS_TO_PASS == ["b"]
    ds.to_json(str(tmp_path / "swe.jsonl"))  # the JSONL SWE-bench ships, lists as JSON strings
    assert load_tasks(tmp_path / "swe.jsonl")[0].FAIL_TO_PASS == ["a"]
    (mirror := tmp_path / "mirrors" / "o__r.git").mkdir(parents=True)
    assert task.find_repo(tmp_path / "mirrors") == mirror
    (fetched := tmp_path / "fetched" / "o+r" / "repo").mkdir(parents=True)  # owner+name/repo, as mirrors arrive
    assert task.find_repo(tmp_path / "fetched") == fetched


def _hunk(path: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"


def test_test_command_uses_the_test_files_of_the_test_patch() -> None:
    tp = _hunk("tests/test_x.py") + _hunk("test/fixtures/rules/L060.yml") + _hunk("tests/data/expected.json")
    t = SWETask.model_validate(_row(test_patch=tp, recipe={}))
    assert t.test_files == ["tests/test_x.py", "test/fixtures/rules/L060.yml", "tests/data/expected.json"]
    # A YAML fixture or JSON data file is not a test to run (SWE-bench filters them too).
    assert t.test_directives() == ["tests/test_x.py"]
    assert t.test_command() == "python -m pytest -rA -p no:cacheprovider tests/test_x.py"
    # A command without the placeholder names its own tests.
    t2 = t.model_copy(update={"recipe": Recipe(test_cmd="pytest -rA tests")})
    assert t2.test_command() == "pytest -rA tests"
    assert diff_files("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n") == ["x.py"]
    with pytest.raises(RecipeError, match="no recipe"):
        SWETask.model_validate(_row(test_patch=tp)).test_command()


def test_rename_in_a_test_patch_names_both_paths() -> None:
    tp = "diff --git a/test/a.py b/test/a_test.py\nsimilarity index 100%\nrename from test/a.py\nrename to test/a_test.py\n"
    assert diff_paths(tp) == ["test/a.py", "test/a_test.py"]
    assert diff_files(tp) == ["test/a_test.py"]


def test_rows_as_users_have_them(tmp_path: Path) -> None:
    """A JSON array (as several tools ship SWE-bench splits), extra keys ignored, a numeric
    version kept as text, and a SWE-smith row (bug patch, upstream repository at the commit
    in its name, the fix is the reversed patch, tests from FAIL_TO_PASS)."""
    rows = [_row(version=3.0, patch_files=["x.py"], difficulty="<15 min fix"),
            {"instance_id": "pandas-dev__pandas.95280573.pr_53652", "repo": "swesmith/pandas-dev__pandas.95280573",
             "patch": _hunk("pandas/core/indexes/base.py"), "base_commit": "d1c5199b6a9d7ae9382d26ee2859b837107165e7",
             "image_name": "swesmith.x86_64.pandas-dev__pandas.95280573", "created_at": "2025-03-21T08:23:31.701599",
             "FAIL_TO_PASS": ["pandas/tests/indexing/test_datetime.py::TestDatetimeIndex::test_getitem_pyarrow_index[DataFrame]"],
             "PASS_TO_PASS": ["pandas/tests/indexing/test_datetime.py::TestDatetimeIndex::test_indexing_fast_xs",
                              "pandas/tests/test_other.py::test_x"]}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    plain, smith = load_tasks(path)
    assert plain.version == "3.0"
    assert smith.repo == "pandas-dev/pandas" and smith.base_commit == "95280573"
    assert smith.smith_repo == "swesmith/pandas-dev__pandas.95280573"
    assert smith.setup_patch == smith.patch and smith.gold_reverse
    assert smith.test_directives() == ["pandas/tests/indexing/test_datetime.py"]
    (tmp_path / "bad.json").write_text('["not a row"]')
    with pytest.raises(ValueError, match=r"bad\.json:1: the row is a str, not a JSON object"):
        load_tasks(tmp_path / "bad.json")
    (tmp_path / "lines.json").write_text(json.dumps(rows[0]) + "\n")  # JSONL, whatever the name
    assert [t.instance_id for t in load_tasks(tmp_path / "lines.json")] == ["o__r-1"]


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


def test_a_directory_of_data_files(tmp_path: Path) -> None:
    """A dataset as the hub stores it (data/<split>-*.parquet), loaded from disk."""
    from datasets import Dataset

    (tmp_path / "ds" / "data").mkdir(parents=True)
    Dataset.from_list([_row(FAIL_TO_PASS='["a"]', version="0.8")]).to_parquet(str(tmp_path / "ds" / "data" / "test-00000-of-00001.parquet"))
    (task,) = load_tasks(str(tmp_path / "ds"), split="test")
    assert task.FAIL_TO_PASS == ["a"] and task.version == "0.8"
