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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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


class MissingRepository(FileNotFoundError):
    """No local repository for a task: the message names $SANDGYM_SWE_MIRRORS, where it
    looked and how to get a mirror."""


class RowError(ValueError):
    """A row that is not a valid task: the message names the file, line and instance id."""


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
    apt: tuple[str, ...] = Field((), description="Debian packages the env image installs (a conda env's C libraries "
                                                 "and programs, and a spec's apt steps).")
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

    @field_validator("pip", "install", "pre_install", "eval_commands", "constraints", "apt", mode="before")
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
                "requirements": self.requirements, "constraints": list(self.constraints),
                **({"apt": list(self.apt)} if self.apt else {})}  # only where set: other env images keep their hash

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

    def mirror_names(self) -> list[str]:
        """The names a mirror of the task's repository may have under a mirrors directory."""
        slug = self.repo.replace("/", "__")
        plus = self.repo.replace("/", "+")
        name = self.repo.split("/")[-1]
        return [slug, slug + ".git", plus + "/repo", plus, plus + ".git", self.repo, self.repo + ".git", name, name + ".git"]

    def find_repo(self, mirrors: str | os.PathLike[str] | None = None) -> Path:
        """The local git repository for this task; MissingRepository (a FileNotFoundError)
        says where it looked."""
        if self.repo_path:
            p = Path(self.repo_path).expanduser()
            if p.exists():
                return p
        root = mirrors or os.environ.get(MIRRORS_ENV)
        if root:
            for name in self.mirror_names():
                p = Path(root) / name
                if p.exists():
                    return p
        raise MissingRepository(missing_repository_message([self], mirrors))


def missing_repository_message(tasks: Iterable[SWETask], mirrors: str | os.PathLike[str] | None = None) -> str:
    """One message for the repositories of `tasks` that have no local copy: which, where it
    looked (--mirrors, else $SANDGYM_SWE_MIRRORS, and each row's repo_path), and how to get one."""
    tasks = list(tasks)
    root = mirrors or os.environ.get(MIRRORS_ENV)
    repos = list(dict.fromkeys(t.repo for t in tasks))
    ids = [t.instance_id for t in tasks]
    which = ", ".join(repos) + f" (instance{'s' if len(ids) > 1 else ''} {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''})"
    paths = [t.repo_path for t in tasks if t.repo_path]
    looked = f"; the rows' repo_path: {', '.join(dict.fromkeys(paths))}" if paths else ""
    example = tasks[0] if tasks else None
    if root:
        names = ", ".join(example.mirror_names()[:5]) if example else "OWNER__NAME"
        where = f"looked in {root} (from {'--mirrors' if mirrors else '$' + MIRRORS_ENV}) for {names}{looked}"
    else:
        where = f"${MIRRORS_ENV} is not set and no --mirrors was given{looked}"
    clone = (f"git clone --mirror https://github.com/{example.repo}.git {root or 'MIRRORS'}/{example.repo.replace('/', '__')}"
             if example else "")
    return (f"no local repository for {which}: {where}. Task images are built from a bare mirror of each repository "
            f"(nothing is fetched at run time): {clone}, then set ${MIRRORS_ENV}={root or 'MIRRORS'} (or --mirrors)")


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """(where, row) for each row of a JSON array, or of one JSON object per line (whatever
    the file is called); `where` is `file:line` of the row's first line."""
    text = path.read_text()
    rows: list[tuple[str, Any]] = []
    if text.lstrip().startswith("["):
        dec = json.JSONDecoder()
        i = text.index("[") + 1
        while True:
            while i < len(text) and text[i] in " \t\r\n,":
                i += 1
            if i >= len(text):
                raise ValueError(f"{path}: not a JSON array of rows: no closing ]")
            if text[i] == "]":
                break
            try:
                row, end = dec.raw_decode(text, i)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{exc.lineno}: not a JSON array of rows: {exc.msg}") from exc
            rows.append((f"{path}:{text.count(chr(10), 0, i) + 1}", row))
            i = end
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON object: {exc}") from exc
    for where, r in rows:
        if not isinstance(r, dict):
            raise RowError(f"{where}: the row is a {type(r).__name__}, not a JSON object")
    return rows


def validate_row(where: str, row: Any) -> SWETask:
    """The row as a task; RowError naming `where`, the instance id and each bad field."""
    if isinstance(row, SWETask):
        return row
    try:
        return SWETask.model_validate(row)
    except ValidationError as exc:
        iid = row.get("instance_id") if isinstance(row, Mapping) else None
        fields = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'row'}: {e['msg']}" for e in exc.errors()[:5])
        raise RowError(f"{where}: {iid or '(no instance_id)'}: not a valid task: {fields}") from None
    except ValueError as exc:  # a recipe string that is not JSON, say
        iid = row.get("instance_id") if isinstance(row, Mapping) else None
        raise RowError(f"{where}: {iid or '(no instance_id)'}: not a valid task: {exc}") from None


_DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow")


class TaskFileNotFound(FileNotFoundError):
    """A task source that can only be a local path, and is not there."""


def _names_a_path(name: str) -> bool:
    """Whether `name` can only be a local path: absolute, relative to ., or a data file's
    name (a hub name is `owner/name` or `name`)."""
    return name.startswith(("/", "./", "../")) or name.lower().endswith(_DATA_SUFFIXES)


def load_tasks(source: Any, *, split: str = "test", instance_ids: Iterable[str] | None = None) -> list[SWETask]:
    """Tasks from a JSONL file, a JSON array file, a list of dicts, a Hugging Face
    `Dataset`, a `save_to_disk` directory, a directory of data files, or a dataset name
    loadable with `datasets.load_dataset` (from the hub when it is reachable)."""
    rows: list[tuple[str, Any]]
    if isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        path = Path(source)
        rows = _read_rows(path)
        base = path.parent
        for _, r in rows:  # a relative repo_path is relative to the rows file
            if isinstance(r, dict) and r.get("repo_path") and not Path(r["repo_path"]).is_absolute():
                r["repo_path"] = str((base / r["repo_path"]).resolve())
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "state.json").is_file():
        from datasets import load_from_disk  # a Dataset.save_to_disk directory

        rows = [(f"{source} row {n}", r) for n, r in enumerate(load_from_disk(str(source)), 1)]
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "dataset_dict.json").is_file():
        from datasets import load_from_disk

        rows = [(f"{source} [{split}] row {n}", r) for n, r in enumerate(load_from_disk(str(source))[split], 1)]
    elif isinstance(source, (str, os.PathLike)) and _names_a_path(str(source)) and not Path(source).exists():
        # Not a hub name either: say so now rather than after `datasets` (1.3 s to import)
        # has tried the hub.
        raise TaskFileNotFound(f"no such file or directory: {source}")
    elif isinstance(source, (str, os.PathLike)):
        from datasets import load_dataset  # a data directory, or a hub name (cache or network)

        rows = [(f"{source} [{split}] row {n}", r) for n, r in enumerate(load_dataset(str(source), split=split), 1)]
    elif hasattr(source, "to_list") and hasattr(source, "column_names"):
        rows = [(f"row {n}", r) for n, r in enumerate(source.to_list(), 1)]
    else:
        rows = [(f"row {n}", r) for n, r in enumerate(source, 1)]
    tasks = [validate_row(where, r) for where, r in rows]
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
