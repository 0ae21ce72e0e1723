"""SWE-bench-format tasks: one JSON object per instance, plus the recipe for its image.

Rows are read as users have them: SWE-bench, SWE-bench Lite/Verified and SWE-Gym rows
(`instance_id`, `repo`, `base_commit`, `patch`, `test_patch`, `FAIL_TO_PASS`,
`PASS_TO_PASS`, `version`, `environment_setup_commit`, ...; the test lists may be JSON
strings) and SWE-smith rows (`repo` = `swesmith/<owner>__<name>.<commit>`, `patch` = the
bug, no test patch), from a JSONL file, a JSON array, a `datasets` directory or hub name.

The image recipe (Python version, pip packages, install commands, test command, log
parser) comes from the row (a nested `recipe` object or the same keys at the top level), a
user recipes file, or the swebench package's per-repo/version specs (sandgym.swe.specs);
`recipe` stays None until one of them is resolved, and a row no source covers fails with a
clear error rather than an empty install. Where the repository comes from is `repo_path`
(a local git directory or bare mirror) or a mirror under `SANDGYM_SWE_MIRRORS`; nothing is
ever fetched from the network.
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

DEFAULT_BASE_IMAGE = "sandgym/python:latest"  # Debian bookworm, Python 3.11
DEFAULT_PYTHON = "3.11"
TESTBED = "/testbed"  # the repository inside the sandbox (SWE-bench's path)
MIRRORS_ENV = "SANDGYM_SWE_MIRRORS"
START_TEST_OUTPUT = ">>>>> Start Test Output"  # SWE-bench's markers around the test output
END_TEST_OUTPUT = ">>>>> End Test Output"

_RECIPE_KEYS = ("python", "base_image", "pip", "requirements", "constraints", "pre_install", "install",
                "eval_commands", "test_cmd", "test_framework", "log_parser", "env", "test_timeout_s", "history")
# Files the test patch touches that are not tests (SWE-bench's NON_TEST_EXTS, used when the
# swebench package is not installed).
_NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")


class RecipeError(ValueError):
    """No recipe covers the task (or its spec cannot be turned into one)."""


class Recipe(BaseModel):
    """How to build a task's image and run its tests.

    The env layer (shared by every task with the same python / base image / pip /
    requirements / constraints) is a venv at /opt/task/venv. `pre_install` then `install`
    commands run at image build time in /testbed (the repository at base_commit) with host
    networking; `constraints` apply to every pip install of the build. `eval_commands` run
    before the tests; `test_cmd` runs in /testbed, its `{tests}` replaced with the test
    files the test patch touches (non-test files left out, as SWE-bench does).
    `log_parser` names how test output becomes per-test statuses (sandgym.swe.testparse).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    python: str = Field(DEFAULT_PYTHON, description="Python version (X.Y) the image must have.")
    base_image: str | None = Field(None, description="Image to build FROM (default: sandgym/python for `python`).")
    pip: tuple[str, ...] = ("pytest",)
    requirements: str = Field("", description="A requirements file's text, installed into the env.")
    constraints: tuple[str, ...] = Field((), description="pip constraints (pins) for every install of the build.")
    pre_install: tuple[str, ...] = ()
    install: tuple[str, ...] = ()
    eval_commands: tuple[str, ...] = ()
    test_cmd: str = "python -m pytest -rA -p no:cacheprovider {tests}"
    test_framework: Literal["pytest", "unittest", "auto"] = "auto"
    log_parser: str | None = Field(None, description="Parser name, `swebench:<owner/name>` or `module:function`.")
    env: dict[str, str] = Field(default_factory=dict)
    test_timeout_s: float = Field(600.0, gt=0)
    history: Literal["full", "shallow"] = Field(
        "full", description="full: history and tags up to base_commit (setuptools_scm works); shallow: that commit only.")
    source: str = Field("row", description="Where the recipe came from (row, a recipes file, a swebench spec).")
    notes: tuple[str, ...] = Field((), description="Pins and adjustments made to the source, each saying why.")

    @field_validator("pip", "install", "pre_install", "eval_commands", "constraints", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @field_validator("python", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        return str(v) if isinstance(v, (int, float)) else v

    def image(self) -> str:
        """The image the env layer builds FROM."""
        if self.base_image:
            return self.base_image
        return DEFAULT_BASE_IMAGE if self.python == DEFAULT_PYTHON else f"sandgym/python:{self.python}"

    def env_hash_material(self) -> dict[str, Any]:
        """What decides the shared environment layer (not the repository's install steps)."""
        return {"python": self.python, "base_image": self.image(), "pip": list(self.pip),
                "requirements": self.requirements, "constraints": list(self.constraints)}

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
_MINUSMINUS = re.compile(r"^--- (?:a/)?(\S+)", re.M)


def diff_files(diff: str) -> list[str]:
    """Paths a unified diff touches (new names), in order, without duplicates."""
    found = [m.group(2) for m in _DIFF_FILE.finditer(diff)]
    if not found:
        found = [m.group(1) for m in _PLUSPLUS.finditer(diff) if m.group(1) != "/dev/null"]
    return list(dict.fromkeys(found))


def diff_paths(diff: str) -> list[str]:
    """Every path a diff reads or writes (old and new names of renames), without duplicates."""
    found: list[str] = []
    for m in _DIFF_FILE.finditer(diff):
        found += [m.group(1), m.group(2)]
    if not found:
        found = [m.group(1) for m in (*_MINUSMINUS.finditer(diff), *_PLUSPLUS.finditer(diff))]
    return [p for p in dict.fromkeys(found) if p != "/dev/null"]


def _smith_row(data: dict[str, Any]) -> dict[str, Any]:
    """A SWE-smith row as a task: the repository is the upstream one at the commit named in
    `repo`; the row's `patch` creates the bug (applied and committed at image build); the
    fix is that patch reversed; the tests are the files of FAIL_TO_PASS (SWE-smith's eval)."""
    m = re.fullmatch(r"swesmith/([^/]+?)__([^/]+)\.([0-9a-f]{7,40})", str(data.get("repo", "")))
    if not m:
        return data
    owner, name, commit = m.groups()
    data = dict(data)
    data.setdefault("smith_repo", data["repo"])
    data["repo"] = f"{owner}/{name}"
    data["smith_base_commit"] = data.get("base_commit", "")
    data["base_commit"] = commit
    data["setup_patch"] = data.get("patch", "")
    data["gold_reverse"] = True
    return data


class SWETask(BaseModel):
    """One SWE-bench-style instance."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1, description="owner/name (SWE-bench) or any name.")
    base_commit: str = Field(min_length=4)
    patch: str = Field("", description="The gold patch (unified diff); for SWE-smith rows, the bug.")
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    problem_statement: str = ""
    hints_text: str = ""
    version: str = ""
    created_at: str = ""
    environment_setup_commit: str = ""
    repo_path: str | None = Field(None, description="Local git directory or mirror of `repo`.")
    recipe: Recipe | None = Field(None, description="None until resolved (sandgym.swe.specs.RecipeResolver).")
    recipe_error: str | None = Field(None, description="Why no recipe could be resolved.")
    setup_patch: str = Field("", description="Applied and committed at image build (SWE-smith: the bug).")
    gold_reverse: bool = Field(False, description="The gold step applies `patch` reversed (SWE-smith).")
    smith_repo: str = ""
    network: bool = Field(False, description="Network for the task's tests: its sandbox gets the operator's egress allow-list (--network-allow); off by default.")
    debug_command: str | None = Field(None, description="Shell command for `--step command`.")
    debug_script: str | None = Field(None, description="Script text for `--step script`.")

    @model_validator(mode="before")
    @classmethod
    def _gather_recipe(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = _smith_row(dict(data))
        if isinstance(data.get("version"), (int, float)):
            data["version"] = str(data["version"])
        recipe = data.get("recipe")
        if isinstance(recipe, str):
            recipe = json.loads(recipe) if recipe.strip() else None
        given = recipe is not None  # an explicit `recipe: {}` means the defaults, on purpose
        recipe = dict(recipe) if recipe else {}
        for key in _RECIPE_KEYS:
            if key in data and data[key] is not None:
                recipe.setdefault(key, data.pop(key))
            else:
                data.pop(key, None)
        data["recipe"] = recipe if (recipe or given) else None
        return data

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_lists(cls, v: Any) -> Any:
        return _json_list(v)

    @property
    def test_files(self) -> list[str]:
        return diff_files(self.test_patch)

    def require_recipe(self) -> Recipe:
        if self.recipe is None:
            raise RecipeError(self.recipe_error or f"{self.instance_id}: no recipe resolved for {self.repo} {self.version}")
        return self.recipe

    def test_directives(self) -> list[str]:
        """What `{tests}` becomes: the test files of the test patch, non-test files left
        out (SWE-bench's own `get_test_directives` when installed: it also turns Django's
        paths into module names); for SWE-smith rows, the files of FAIL_TO_PASS."""
        if not self.test_patch.strip() and self.setup_patch:
            return list(dict.fromkeys(t.split("::", 1)[0] for t in self.FAIL_TO_PASS if "::" in t))
        try:
            from swebench.harness.test_spec.python import get_test_directives
        except ImportError:
            return [d for d in self.test_files if not d.endswith(_NON_TEST_EXTS)]
        return list(get_test_directives({"repo": self.repo, "test_patch": self.test_patch}))

    def test_command(self) -> str:
        recipe = self.require_recipe()
        tests = " ".join(shlex.quote(f) for f in self.test_directives())
        # No placeholder: the command names its own tests (specs get ` {tests}` appended,
        # which is where SWE-bench puts the test files).
        return recipe.test_cmd.replace("{tests}", tests)

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
            owner_name = self.repo.split("/")
            slug = self.repo.replace("/", "__")
            plus = self.repo.replace("/", "+")
            names = [slug, slug + ".git", plus + "/repo", plus, plus + ".git", self.repo, self.repo + ".git",
                     owner_name[-1], owner_name[-1] + ".git"]
            for name in names:
                p = Path(root) / name
                if p.exists():
                    return p
                tried.append(str(p))
        raise FileNotFoundError(
            f"{self.instance_id}: no local repository for {self.repo!r} (looked at: {', '.join(tried) or 'nothing'}); "
            f"set `repo_path` in the task or ${MIRRORS_ENV} to a directory of mirrors"
        )


def _read_rows(path: Path) -> list[Any]:
    """A JSON array of rows, or one JSON object per line (whatever the file is called)."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON array of rows: {exc}") from exc
        rows = list(data)
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON object: {exc}") from exc
    for n, r in enumerate(rows, 1):
        if not isinstance(r, dict):
            raise ValueError(f"{path}: row {n} is a {type(r).__name__}, not a JSON object")
    return rows


def load_tasks(source: Any, *, split: str = "test", instance_ids: Iterable[str] | None = None) -> list[SWETask]:
    """Tasks from a JSONL file, a JSON array file, a list of dicts, a Hugging Face
    `Dataset`, a `save_to_disk` directory, a directory of data files, or a dataset name
    loadable with `datasets.load_dataset` (from the hub when it is reachable)."""
    rows: list[Any]
    if isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        path = Path(source)
        rows = _read_rows(path)
        base = path.parent
        for r in rows:  # a relative repo_path is relative to the rows file
            if isinstance(r, dict) and r.get("repo_path") and not Path(r["repo_path"]).is_absolute():
                r["repo_path"] = str((base / r["repo_path"]).resolve())
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "state.json").is_file():
        from datasets import load_from_disk  # a Dataset.save_to_disk directory

        rows = list(load_from_disk(str(source)))
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "dataset_dict.json").is_file():
        from datasets import load_from_disk

        rows = list(load_from_disk(str(source))[split])
    elif isinstance(source, (str, os.PathLike)):
        from datasets import load_dataset  # a data directory, or a hub name (cache or network)

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
    p.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in tasks))
    return p
