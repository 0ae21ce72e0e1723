"""Recipes for rows that carry none: from a user recipes file, or from the swebench
package's own per-repo/version specs (nothing of them is copied here).

swebench 4.x keeps `MAP_REPO_VERSION_TO_SPECS` (python, conda `packages`, `pip_packages`,
`pre_install`, `install`, `eval_commands`, `test_cmd`), `MAP_REPO_TO_REQS_PATHS` and the
per-repo log parsers (`MAP_REPO_TO_PARSER`); 5.x dropped the specs (its images come from
the dataset), so the `swe` extra asks for `swebench>=4.1,<5`. SWE-bench builds a conda
env; here the env is a venv on a Debian base with that Python, so a spec becomes:

- `python` -> the image's Python (`sandgym images build --python X.Y`);
- conda `packages` -> pip requirements (`name=1.2` -> `name==1.2`); `requirements.txt` ->
  the repo's requirements file read from the local mirror at `environment_setup_commit`
  (the paths and `-r` includes SWE-bench fetches from GitHub), cleaned with swebench's own
  `clean_requirements`; `environment.yml` specs (conda-only) are refused with a clear error;
- `pip_packages` -> pip; `pre_install`, `install`, `eval_commands`, `test_cmd` as they are;
- `log_parser` -> `swebench` (the repo's parser in `MAP_REPO_TO_PARSER`);
- pins for what drifted since SWE-bench built its images (sandgym.swe.pins), as pip
  constraints, and swaps of conda builds PyPI has no wheel of, each noted in `recipe.notes`
  with why and where it comes from.

A user recipes file (JSON or TOML) maps `owner/name` to `{version or "*": recipe}` for
repositories no spec covers (SWE-Gym, SWE-smith) or to override one.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .conda import CondaSpecError, conda_to_pip, environment_to_pip
from .pins import pins_for, python_swap_for, step_swaps_for, swaps_for
from .tasks import MissingRepository, Recipe, RecipeError, SWETask

SWEBENCH_HINT = "pip install 'sandgym[swe]' (the swebench package, 4.x: its specs and log parsers)"


class NeedsRepository(RecipeError):
    """The spec's requirements are read from the repository, and there is no local one."""


def swebench_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("swebench")
    except Exception:
        return None


def swebench_constants() -> Any:
    """swebench's harness constants (specs, requirement paths); RecipeError when missing."""
    try:
        from swebench.harness import constants
    except ImportError as exc:
        raise RecipeError(f"the swebench package is not installed ({exc}); {SWEBENCH_HINT}") from exc
    if not hasattr(constants, "MAP_REPO_VERSION_TO_SPECS"):
        raise RecipeError(f"swebench {swebench_version()} has no MAP_REPO_VERSION_TO_SPECS (5.x moved specs into "
                          f"the datasets); install swebench>=4.1,<5 or give the rows a recipe")
    return constants


def _git_show(repo: Path, commit: str, path: str) -> str | None:
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def _first_file(task: SWETask, repo: Path, paths: Iterable[str]) -> tuple[str, str]:
    """(path, text) of the first of `paths` in the repository at `environment_setup_commit`."""
    commit = task.environment_setup_commit or task.base_commit
    paths = list(paths)
    for path in paths:
        text = _git_show(repo, commit, path)
        if text is not None:
            return path, text
    raise RecipeError(f"{task.instance_id}: none of {paths} exists in {repo} at {commit[:12]}")


def requirements_from_repo(task: SWETask, repo: Path, paths: Iterable[str]) -> str:
    """The requirements text SWE-bench's `get_requirements` builds, read from the local
    repository at `environment_setup_commit` instead of GitHub (same paths, first found
    wins, `-r` includes inlined, `-e .`/comments/`.[test` lines dropped)."""
    commit = task.environment_setup_commit or task.base_commit
    req_path, text = _first_file(task, repo, paths)

    def excluded(line: str) -> bool:
        return any(line.strip().startswith(x) for x in ("-e .", "#", ".[test"))

    original, additional = [], []
    req_dir = posixpath.dirname(req_path)
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            inc = _git_show(repo, commit, posixpath.normpath(posixpath.join(req_dir, line[2:].strip())))
            if inc is not None:
                additional += [x for x in inc.split("\n") if not excluded(x)]
        elif not excluded(line):
            original.append(line)
    additional.append("\n".join(original))
    text = "\n".join(additional)
    try:
        from swebench.harness.test_spec.python import clean_requirements
    except ImportError:
        return text
    return clean_requirements(text)


def environment_yml_from_repo(task: SWETask, repo: Path, paths: Iterable[str]) -> tuple[str, str]:
    """(path, text) of the environment.yml SWE-bench's `get_environment_yml` fetches, read from
    the local repository at `environment_setup_commit` (same paths, first found wins), cleaned
    with swebench's own `clean_environment_yml` (packages yanked from PyPI)."""
    path, text = _first_file(task, repo, paths)
    try:
        from swebench.harness.test_spec.python import clean_environment_yml
    except ImportError:
        return path, text
    return path, clean_environment_yml(text)


def recipe_from_spec(task: SWETask, repo: Path | None, *, env: bool = True) -> Recipe:
    """The recipe swebench's spec gives `task.repo` at `task.version` (RecipeError if none).
    `env=False` (a prebuilt SWE-bench image, whose conda env and install are done): only
    what the tests need (test command, eval commands, env vars, parser); no repository."""
    c = swebench_constants()
    by_version = c.MAP_REPO_VERSION_TO_SPECS.get(task.repo)
    if by_version is None:
        raise RecipeError(f"{task.instance_id}: swebench {swebench_version()} has no specs for {task.repo!r}; "
                          f"give the row a `recipe` or pass --recipes FILE")
    spec = by_version.get(task.version)
    if spec is None:
        raise RecipeError(f"{task.instance_id}: swebench {swebench_version()} has no spec for {task.repo} version "
                          f"{task.version!r} (known: {', '.join(sorted(by_version))}); give the row a `recipe` or pass --recipes FILE")
    if "test_cmd" not in spec:
        raise RecipeError(f"{task.instance_id}: the swebench spec for {task.repo} {task.version} has no test_cmd")
    test_cmd = spec["test_cmd"]
    if isinstance(test_cmd, list):
        test_cmd = test_cmd[-1]
    tests = dict(
        python=str(spec["python"]), eval_commands=tuple(spec.get("eval_commands", [])), test_cmd=f"{test_cmd} {{tests}}",
        log_parser="swebench", env=dict(spec.get("env", {}) or {}),
        test_timeout_s=1800.0,  # run_evaluation's default --timeout
    )
    source = f"swebench {swebench_version()} spec {task.repo} {task.version}"
    if not env:
        return Recipe(**tests, pip=(), source=f"{source} (tests only: the prebuilt image holds the env)")
    notes: list[str] = []
    py_swap = python_swap_for(task.repo, task.version, str(spec["python"]))
    if py_swap is not None:
        tests["python"] = py_swap.new
        notes.append(f"Python {py_swap.old} -> {py_swap.new}: {py_swap.why} (source: {py_swap.source})")
    env_vars = dict(spec.get("env", {}) or {})
    apt: list[str] = []
    constraints: list[str] = []
    pip: list[str] = []
    requirements = ""
    packages = spec.get("packages", "")
    if packages == "requirements.txt":
        paths = c.MAP_REPO_TO_REQS_PATHS.get(task.repo)
        if not paths:
            raise RecipeError(f"{task.instance_id}: spec wants requirements.txt but swebench lists no path for {task.repo}")
        if repo is None:
            raise NeedsRepository(f"{task.instance_id}: the spec's requirements come from the repository; no local repository")
        requirements = requirements_from_repo(task, repo, paths)
    elif packages == "environment.yml":
        # SWE-bench: the conda env from the file, then `pip install <pip_packages>` over it. Here
        # the file's packages as pip requirements, installed under the spec's exact pip pins
        # (what the env ends with) so that nothing is resolved against versions replaced later.
        if repo is None:
            raise NeedsRepository(f"{task.instance_id}: the spec's environment.yml comes from the repository; no local repository")
        yml_path, text = environment_yml_from_repo(task, repo, c.MAP_REPO_TO_ENV_YML_PATHS.get(task.repo) or ["environment.yml"])
        try:
            conda_env = environment_to_pip(text, source=f"{task.repo} {yml_path}")
        except CondaSpecError as exc:
            raise RecipeError(f"{task.instance_id}: {exc}") from exc
        requirements = "".join(r + "\n" for r in conda_env.requirements)
        apt += conda_env.apt
        notes += [f"{yml_path}: {n}" for n in conda_env.notes]
        constraints += [p for p in spec.get("pip_packages", []) if re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[^,;]+", p)]
    elif packages:
        pip += conda_to_pip(packages)
    pip += list(spec.get("pip_packages", []))
    for swap in swaps_for(task.repo, task.version, str(tests["python"])):
        if swap.old in pip:
            pip = [swap.new if x == swap.old else x for x in pip]
            notes.append(f"{swap.old} -> {swap.new}: {swap.why} (source: {swap.source})")
    install = [c.MAP_REPO_TO_INSTALL[task.repo]] if c.MAP_REPO_TO_INSTALL.get(task.repo) else []
    if spec.get("install"):
        install.append(spec["install"])
    for pin in pins_for(task.repo, task.version):
        constraints.append(pin.requirement)
        notes.append(f"{pin.requirement}: {pin.why} (source: {pin.source})")
    pre_install = list(spec.get("pre_install", []))
    for step in step_swaps_for(task.repo, task.version):
        dropped = [cmd for cmd in pre_install if any(re.search(d, cmd) for d in step.drop)]
        pre_install = [*(cmd for cmd in pre_install if cmd not in dropped), *step.add]
        apt += [p for p in step.apt if p not in apt]
        env_vars.update(step.env)
        notes.append(f"{len(dropped)} pre_install step(s) replaced: {step.why} (source: {step.source})")
    return Recipe(
        **{**tests, "env": env_vars}, pip=tuple(pip), requirements=requirements, constraints=tuple(constraints), apt=tuple(apt),
        pre_install=tuple(pre_install), install=tuple(install), source=source, notes=tuple(notes),
    )


def load_recipes_file(path: str | os.PathLike[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """`{"owner/name": {"<version>" or "*": {recipe keys}}}` from JSON or TOML."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text()) if p.suffix == ".toml" else json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot read recipes file {p}: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise RecipeError(f"{p}: expected {{'owner/name': {{'version' or '*': recipe}}}}")
    for repo, versions in data.items():
        for ver, rec in versions.items():
            try:
                Recipe.model_validate({**rec, "source": f"{p.name} {repo} {ver}"})
            except ValueError as exc:
                raise RecipeError(f"{p}: {repo} {ver}: {exc}") from exc
    return data


class RecipeResolver:
    """Gives each task its recipe: the row's own, else the recipes file's (exact version,
    then `*`), else swebench's spec. A task nothing covers keeps `recipe=None` and gets
    `recipe_error` (the run reports it for that instance; nothing is installed silently)."""

    def __init__(self, *, mirrors: str | os.PathLike[str] | None = None,
                 recipes: Mapping[str, Mapping[str, Mapping[str, Any]]] | str | os.PathLike[str] | None = None) -> None:
        self.mirrors = mirrors
        self.recipes = load_recipes_file(recipes) if isinstance(recipes, (str, os.PathLike)) else dict(recipes or {})

    def resolve(self, task: SWETask, *, prebuilt: bool = False) -> SWETask:
        """`prebuilt`: for a SWE-bench prebuilt image (a spec gives only the test side, and
        needs no repository; `environment.yml` specs are fine there). A spec that reads the
        repository's requirements raises MissingRepository when there is no local copy (the
        same error the image build gives: where it looked and how to get one)."""
        if task.recipe is not None or task.recipe_error:
            return task
        try:
            recipe = self._from_file(task) or (recipe_from_spec(task, None, env=False) if prebuilt
                                               else recipe_from_spec(task, self._repo(task)))
        except NeedsRepository:
            task.find_repo(self.mirrors)  # raises MissingRepository, saying where it looked
            raise
        except RecipeError as exc:
            return task.model_copy(update={"recipe_error": str(exc)})
        return task.model_copy(update={"recipe": recipe})

    def resolve_all(self, tasks: Iterable[SWETask]) -> list[SWETask]:
        return [self.resolve(t) for t in tasks]

    def _from_file(self, task: SWETask) -> Recipe | None:
        versions = self.recipes.get(task.repo)
        if not versions:
            return None
        rec = versions.get(task.version) or versions.get("*")
        if rec is None:
            return None
        return Recipe.model_validate({**rec, "source": f"recipes file {task.repo} {task.version if task.version in versions else '*'}"})

    def _repo(self, task: SWETask) -> Path | None:
        try:
            return task.find_repo(self.mirrors)
        except MissingRepository:
            return None
