"""SWE-bench-format tasks: one JSON object per instance, plus the recipe for its image.

The SWE-bench fields (`instance_id`, `repo`, `base_commit`, `patch`, `test_patch`,
`FAIL_TO_PASS`, `PASS_TO_PASS`, ...) are read as-is; SWE-bench stores the test lists as
JSON strings, so strings are decoded. The image recipe (python version, pip packages,
install commands, test command) is either a nested `recipe` object or the same keys at the
top level. Where the repository comes from is `repo_path` (a local git directory or bare
mirror) or `<mirrors>/<owner>__<name>[.git]`; nothing is ever fetched from the network.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_BASE_IMAGE = "sandgym/python:latest"
TESTBED = "/testbed"  # the repository inside the sandbox (SWE-bench's path)
MIRRORS_ENV = "SANDGYM_SWE_MIRRORS"

_RECIPE_KEYS = ("python", "base_image", "pip", "install", "test_cmd", "test_framework", "env", "test_timeout_s")


class Recipe(BaseModel):
    """How to build a task's image and run its tests.

    `install` commands run at image build time in /testbed (the repository at base_commit)
    with host networking, inside the task's venv; `pip` packages are installed into the venv
    in a layer shared by every task with the same recipe. `test_cmd` runs in /testbed; a
    `{tests}` placeholder is replaced with the test files the test patch touches.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    python: str = Field("3.11", description="Python version prefix the image must have.")
    base_image: str = DEFAULT_BASE_IMAGE
    pip: tuple[str, ...] = ("pytest",)
    install: tuple[str, ...] = ()
    test_cmd: str = "python -m pytest -rA -p no:cacheprovider {tests}"
    test_framework: Literal["pytest", "unittest", "auto"] = "auto"
    env: dict[str, str] = Field(default_factory=dict)
    test_timeout_s: float = Field(600.0, gt=0)

    @field_validator("pip", "install", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    def env_hash_material(self) -> dict[str, Any]:
        """What decides the shared environment layer (not the repository's install steps)."""
        return {"python": self.python, "base_image": self.base_image, "pip": list(self.pip)}

    def framework(self) -> str:
        if self.test_framework != "auto":
            return self.test_framework
        return "unittest" if "unittest" in self.test_cmd or "runtests" in self.test_cmd else "pytest"


def _json_list(v: Any) -> Any:
    if isinstance(v, str):
        v = v.strip()
        if not v:
            return []
        try:
            return json.loads(v)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON list of test ids, got {v[:80]!r}") from exc
    return v


_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_PLUSPLUS = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.M)


def diff_files(diff: str) -> list[str]:
    """Paths a unified diff touches (new names), in order, without duplicates."""
    found = [m.group(2) for m in _DIFF_FILE.finditer(diff)]
    if not found:
        found = [m.group(1) for m in _PLUSPLUS.finditer(diff) if m.group(1) != "/dev/null"]
    return list(dict.fromkeys(found))


class SWETask(BaseModel):
    """One SWE-bench-style instance."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1, description="owner/name (SWE-bench) or any name.")
    base_commit: str = Field(min_length=4)
    patch: str = Field("", description="The gold patch (unified diff).")
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    problem_statement: str = ""
    hints_text: str = ""
    version: str = ""
    created_at: str = ""
    environment_setup_commit: str = ""
    repo_path: str | None = Field(None, description="Local git directory or mirror of `repo`.")
    recipe: Recipe = Field(default_factory=Recipe)
    debug_command: str | None = Field(None, description="Shell command for `--step command`.")
    debug_script: str | None = Field(None, description="Script text for `--step script`.")

    @model_validator(mode="before")
    @classmethod
    def _gather_recipe(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        recipe = data.get("recipe")
        if isinstance(recipe, str):
            recipe = json.loads(recipe) if recipe.strip() else {}
        recipe = dict(recipe or {})
        for key in _RECIPE_KEYS:
            if key in data and data[key] is not None:
                recipe.setdefault(key, data.pop(key))
            else:
                data.pop(key, None)
        data["recipe"] = recipe
        return data

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_lists(cls, v: Any) -> Any:
        return _json_list(v)

    @property
    def test_files(self) -> list[str]:
        return diff_files(self.test_patch)

    def test_command(self) -> str:
        tests = " ".join(shlex.quote(f) for f in self.test_files)
        return self.recipe.test_cmd.replace("{tests}", tests)

    def find_repo(self, mirrors: str | os.PathLike[str] | None = None) -> Path:
        """The local git repository for this task; raises FileNotFoundError naming where it looked."""
        tried: list[str] = []
        if self.repo_path:
            p = Path(self.repo_path).expanduser()
            if p.exists():
                return p
            tried.append(str(p))
        root = mirrors or os.environ.get(MIRRORS_ENV)
        if root:
            slug = self.repo.replace("/", "__")
            for name in (slug, slug + ".git", self.repo.split("/")[-1], self.repo.split("/")[-1] + ".git"):
                p = Path(root) / name
                if p.exists():
                    return p
                tried.append(str(p))
        raise FileNotFoundError(
            f"{self.instance_id}: no local repository for {self.repo!r} (looked at: {', '.join(tried) or 'nothing'}); "
            f"set `repo_path` in the task or ${MIRRORS_ENV} to a directory of mirrors"
        )


def load_tasks(source: Any, *, split: str = "test", instance_ids: Iterable[str] | None = None) -> list[SWETask]:
    """Tasks from a JSONL file, a list of dicts, a Hugging Face `Dataset`, or a dataset name
    (or local dataset directory) loadable with `datasets.load_dataset`."""
    rows: list[Any]
    if isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        rows = []
        path = Path(source)
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON object: {exc}") from exc
        base = path.parent
        for r in rows:  # a relative repo_path is relative to the JSONL file
            if isinstance(r, dict) and r.get("repo_path") and not Path(r["repo_path"]).is_absolute():
                r["repo_path"] = str((base / r["repo_path"]).resolve())
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "state.json").is_file():
        from datasets import load_from_disk  # a Dataset.save_to_disk directory

        rows = list(load_from_disk(str(source)))
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "dataset_dict.json").is_file():
        from datasets import load_from_disk

        rows = list(load_from_disk(str(source))[split])
    elif isinstance(source, (str, os.PathLike)):
        from datasets import load_dataset  # a hub name (from the local cache) or a data directory

        rows = list(load_dataset(str(source), split=split))
    elif hasattr(source, "to_list") and hasattr(source, "column_names"):
        rows = source.to_list()
    else:
        rows = list(source)
    tasks = [r if isinstance(r, SWETask) else SWETask.model_validate(r) for r in rows]
    if instance_ids is not None:
        wanted = set(instance_ids)
        missing = wanted - {t.instance_id for t in tasks}
        if missing:
            raise KeyError(f"instance(s) not in the task set: {', '.join(sorted(missing))}")
        tasks = [t for t in tasks if t.instance_id in wanted]
    seen: set[str] = set()
    for t in tasks:
        if t.instance_id in seen:
            raise ValueError(f"duplicate instance_id {t.instance_id!r}")
        seen.add(t.instance_id)
    return tasks


def dump_tasks(tasks: Iterable[SWETask], path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    return p
