"""The bundled SWE-style tasks: tiny repositories with a real bug, a gold fix and tests.

Shipped as plain files (sandgym/swe/data/bundled/<instance>/: `repo/` at the buggy
commit, `gold.patch`, `test.patch`, `task.json`). `materialize(dest)` turns each into a git
repository (fixed author, committer and dates, so `base_commit` is the same on every
machine) and writes `tasks.jsonl` whose `repo_path`s point at them. One task
(`romanize__subtractive-broken-gold`) has a deliberately incomplete gold patch: a debug
run must report it as unresolved, naming `tests/test_roman.py::test_subtractive_tens`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from .tasks import SWETask, dump_tasks

DATA = Path(__file__).resolve().parent / "data" / "bundled"
BROKEN = ("romanize__subtractive-broken-gold",)

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "sandgym", "GIT_AUTHOR_EMAIL": "sandgym@localhost",
    "GIT_COMMITTER_NAME": "sandgym", "GIT_COMMITTER_EMAIL": "sandgym@localhost",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
}


def default_dir() -> Path:
    """Where `bundled` task sets are materialized when no directory is given."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandgym" / "swe-bundled"


def resolve_tasks(source: object, *, split: str = "test") -> list[SWETask]:
    """`bundled` (every bundled task), `bundled-good` (without the broken one), a JSONL
    path, a dataset name, a Dataset or a list of tasks."""
    from .tasks import load_tasks

    if isinstance(source, str) and source in ("bundled", "bundled-good"):
        return load_bundled(default_dir(), include_broken=source == "bundled")
    return load_tasks(source, split=split)


def instance_ids(include_broken: bool = True) -> list[str]:
    ids = sorted(p.name for p in DATA.iterdir() if (p / "task.json").is_file())
    return ids if include_broken else [i for i in ids if i not in BROKEN]


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_GIT_ENV}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {cwd} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def init_repo(src: Path, dest: Path, message: str = "base") -> str:
    """Copy `src` to `dest`, make it a one-commit git repository; returns the commit id."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "--no-gpg-sign", "-m", message)
    return _git(dest, "rev-parse", "HEAD")


def load_bundled(dest: str | os.PathLike[str], *, include_broken: bool = True) -> list[SWETask]:
    """Materialize the bundled repositories under `dest` and return their tasks; also
    writes `dest/tasks.jsonl` (and `dest/tasks-good.jsonl` without the broken task)."""
    root = Path(dest).resolve()
    (root / "repos").mkdir(parents=True, exist_ok=True)
    tasks: list[SWETask] = []
    for iid in instance_ids(include_broken=True):
        d = DATA / iid
        meta = json.loads((d / "task.json").read_text())
        repo_dir = root / "repos" / iid
        commit = init_repo(d / "repo", repo_dir, f"{meta['repo']}: base for {iid}")
        meta.pop("broken_gold", None)
        tasks.append(SWETask.model_validate({
            **meta, "base_commit": commit, "repo_path": str(repo_dir),
            "patch": (d / "gold.patch").read_text(), "test_patch": (d / "test.patch").read_text(),
            "version": "0.1",
        }))
    dump_tasks(tasks, root / "tasks.jsonl")
    dump_tasks([t for t in tasks if t.instance_id not in BROKEN], root / "tasks-good.jsonl")
    return tasks if include_broken else [t for t in tasks if t.instance_id not in BROKEN]
