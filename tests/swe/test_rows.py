"""Rows as users load them, and what they are told when something is missing: a hub name
through `datasets` (a local dataset directory of that name: the hub is not reachable here),
invalid rows named by file, line and instance id, and one message for a missing repository
naming $SANDGYM_SWE_MIRRORS and where it looked. No Docker: these fail before any sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.swe.tasks import MIRRORS_ENV, MissingRepository, RowError, load_tasks

LITE = "princeton-nlp/SWE-bench_Lite"


def _row(iid: str, repo: str = "psf/requests", **kw: object) -> dict[str, object]:
    row: dict[str, object] = {"instance_id": iid, "repo": repo, "base_commit": "a" * 40, "patch": "", "test_patch": "",
                              "version": "2.3", "FAIL_TO_PASS": '["t::a"]', "PASS_TO_PASS": "[]",
                              "environment_setup_commit": "b" * 40, "problem_statement": "x", "hints_text": "",
                              "created_at": "2014-03-15T00:00:00Z"}
    row.update(kw)
    return row


def _swe(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    full = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
    full.pop(MIRRORS_ENV, None) if env is None or MIRRORS_ENV not in env else None
    return subprocess.run([sys.executable, "-m", "sandgym", "swe", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=full)


@pytest.fixture
def lite_dir(tmp_path: Path) -> Path:
    """A dataset directory laid out as the hub stores princeton-nlp/SWE-bench_Lite (data/<split>-*.parquet),
    under its hub name, so `datasets.load_dataset("princeton-nlp/SWE-bench_Lite")` reads it."""
    from datasets import Dataset

    data = tmp_path / LITE / "data"
    data.mkdir(parents=True)
    Dataset.from_list([_row("psf__requests-1", repo="psf/requests"), _row("pallets__flask-2", repo="pallets/flask")]).to_parquet(
        str(data / "dev-00000-of-00001.parquet"))
    Dataset.from_list([_row("sympy__sympy-3", repo="sympy/sympy")]).to_parquet(str(data / "test-00000-of-00001.parquet"))
    return tmp_path


def test_a_hub_name_goes_through_datasets(lite_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(lite_dir)
    dev = load_tasks(LITE, split="dev", instance_ids=["pallets__flask-2"])
    assert [(t.instance_id, t.repo, t.FAIL_TO_PASS) for t in dev] == [("pallets__flask-2", "pallets/flask", ["t::a"])]
    assert [t.instance_id for t in load_tasks(LITE, split="test")] == ["sympy__sympy-3"]


def test_debug_by_hub_name_says_which_mirrors_are_missing(lite_dir: Path, tmp_path: Path) -> None:
    """`sandgym swe debug princeton-nlp/SWE-bench_Lite --split dev --instances ...`: the rows come
    through `datasets`; with no mirror for their repositories, one message says which, where it
    looked, and how to get them, before anything is built."""
    mirrors = tmp_path / "mirrors"
    mirrors.mkdir()
    proc = _swe("debug", LITE, "--split", "dev", "--instances", "psf__requests-1,pallets__flask-2", "-o", str(tmp_path / "run"),
                cwd=lite_dir, env={MIRRORS_ENV: str(mirrors)})
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "no local repository for psf/requests, pallets/flask (instances psf__requests-1, pallets__flask-2)" in err
    assert f"looked in {mirrors} (from ${MIRRORS_ENV}) for psf__requests, psf__requests.git" in err
    assert f"git clone --mirror https://github.com/psf/requests.git {mirrors}/psf__requests" in err
    assert not (tmp_path / "run").exists()  # refused before the run folder was made
    # Without the variable, the message says it is not set.
    proc = _swe("validate", LITE, "--split", "dev", "--instances", "psf__requests-1", cwd=lite_dir)
    assert proc.returncode == 2
    assert f"${MIRRORS_ENV} is not set and no --mirrors was given" in " ".join(proc.stderr.split())
    # An id the split does not have is named.
    proc = _swe("debug", LITE, "--split", "dev", "--instances", "psf__requests-404", cwd=lite_dir)
    assert proc.returncode == 2 and "psf__requests-404" in proc.stderr and "Traceback" not in proc.stderr


def test_the_mirror_message_is_the_same_in_the_api(tmp_path: Path) -> None:
    (task,) = load_tasks([_row("psf__requests-1")])
    with pytest.raises(MissingRepository) as exc:
        task.find_repo(tmp_path)
    assert f"looked in {tmp_path} (from --mirrors)" in str(exc.value) and "git clone --mirror" in str(exc.value)
    (tmp_path / "psf__requests.git").mkdir()
    assert task.find_repo(tmp_path) == tmp_path / "psf__requests.git"


def test_invalid_rows_are_named_by_file_line_and_id(tmp_path: Path) -> None:
    good = json.dumps(_row("psf__requests-1"))
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(good + "\n\n" + json.dumps(_row("psf__requests-2", base_commit="", FAIL_TO_PASS="not json")) + "\n")
    with pytest.raises(RowError) as exc:
        load_tasks(jsonl)
    msg = str(exc.value)
    assert msg.startswith(f"{jsonl}:3: psf__requests-2: not a valid task: ")
    assert "base_commit" in msg and "FAIL_TO_PASS" in msg and "expected a JSON list of test ids" in msg
    # A JSON array (as public copies ship the splits): the line where the bad row starts.
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([_row("psf__requests-1"), {"instance_id": "x__y-3", "repo": "x/y"}], indent=2))
    start = [n for n, line in enumerate(array.read_text().splitlines(), 1) if line == "  {"][1]
    with pytest.raises(RowError, match=rf"rows\.json:{start}: x__y-3: not a valid task: base_commit: Field required"):
        load_tasks(array)
    # The CLI says the same in one line, exit 2.
    proc = _swe("debug", str(jsonl), cwd=tmp_path)
    assert proc.returncode == 2 and f"{jsonl.name}:3: psf__requests-2" in proc.stderr and "Traceback" not in proc.stderr


def test_swe_rows_script_extracts_named_rows(lite_dir: Path, tmp_path: Path) -> None:
    """scripts/swe_rows.py: named rows from a dump (JSON array) or a dataset directory, SWE-bench's
    fields only; an id the source lacks is an error naming it."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "swe_rows.py"
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps([{**_row("psf__requests-1"), "patch_files": ["x"]}, _row("pallets__flask-2")]))
    ids = tmp_path / "ids.txt"
    ids.write_text("# rows\npallets__flask-2   # flask\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, str(script), str(dump), "--ids", str(ids), "-i", "psf__requests-1", "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["instance_id"] for r in rows] == ["pallets__flask-2", "psf__requests-1"] and "patch_files" not in rows[1]
    assert [t.instance_id for t in load_tasks(out)] == ["pallets__flask-2", "psf__requests-1"]
    proc = subprocess.run([sys.executable, str(script), LITE, "--split", "dev", "-i", "psf__requests-1", "-i", "nope-1",
                           "-o", str(out)], capture_output=True, text=True, timeout=120, cwd=lite_dir)
    assert proc.returncode == 1 and "nope-1" in proc.stderr
