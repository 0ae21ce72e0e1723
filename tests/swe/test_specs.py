"""Recipes for rows without one: swebench's own specs (read from the installed package),
requirements read from the local repository at environment_setup_commit, a user recipes
file first, and a clear error (never an empty install) when nothing covers a row."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sandgym.swe import pins
from sandgym.swe.bundled import init_repo
from sandgym.swe.specs import RecipeResolver, conda_to_pip, load_recipes_file, recipe_from_spec
from sandgym.swe.tasks import MissingRepository, RecipeError, SWETask
from tests.conftest import require

require("swebench")
import swebench
from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS


def _task(repo: str, version: str, **kw: object) -> SWETask:
    return SWETask.model_validate({"instance_id": f"{repo.replace('/', '__')}-1", "repo": repo, "version": version,
                                   "base_commit": "0" * 40, **kw})


def test_spec_with_pip_packages_and_conda_packages() -> None:
    t = _task("sympy/sympy", "1.1")
    spec = MAP_REPO_VERSION_TO_SPECS["sympy/sympy"]["1.1"]
    r = recipe_from_spec(t, None)
    assert r.python == spec["python"]
    assert r.pip == tuple(conda_to_pip(spec["packages"]) + spec["pip_packages"])
    assert r.install == (spec["install"],)
    assert r.test_cmd == spec["test_cmd"] + " {tests}" and r.log_parser == "swebench"
    assert r.source.startswith(f"swebench {swebench.__version__} spec sympy/sympy 1.1")
    assert conda_to_pip("'numpy==1.19.2' scipy=1.5 'pandas<2.0.0' pytest") == ["numpy==1.19.2", "scipy==1.5", "pandas<2.0.0", "pytest"]


def test_requirements_come_from_the_local_repository(tmp_path: Path) -> None:
    """sqlfluff's spec says `requirements.txt`: SWE-bench fetches requirements_dev.txt from
    GitHub at environment_setup_commit; here the same file comes from the local repository,
    `-r` includes inlined, and swebench's own cleaning (types-pkg_resources was yanked)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "requirements.txt").write_text("click>=7\n")
    (src / "requirements_dev.txt").write_text("-r requirements.txt\n# lint\nflake8\ntypes-pkg_resources\n-e .\npytest\n")
    env_commit = init_repo(src, tmp_path / "mirrors" / "sqlfluff__sqlfluff")
    t = _task("sqlfluff/sqlfluff", "0.8", environment_setup_commit=env_commit)
    r = RecipeResolver(mirrors=tmp_path / "mirrors").resolve(t).recipe
    assert r is not None
    lines = [x for x in r.requirements.splitlines() if x.strip()]
    assert lines == ["click>=7", "flake8", "types-setuptools", "pytest"]
    assert r.install == ("python -m pip install -e .",) and r.python == "3.9"
    # The requirements file is the env's install; nothing of the `packages` field goes to pip.
    assert r.pip == tuple(MAP_REPO_VERSION_TO_SPECS["sqlfluff/sqlfluff"]["0.8"].get("pip_packages", []))
    assert r.apt == () and r.constraints == ()
    # No repository: the requirements cannot be read; the error says where it looked (as the build's does).
    with pytest.raises(MissingRepository, match=r"no local repository for .* looked in .*nothing \(from --mirrors\)"):
        RecipeResolver(mirrors=tmp_path / "nothing").resolve(t)


def test_rows_nothing_covers_fail_clearly() -> None:
    r = RecipeResolver()
    unknown = r.resolve(_task("getmoto/moto", "4.1"))
    assert unknown.recipe is None and "no specs for 'getmoto/moto'" in (unknown.recipe_error or "")
    with pytest.raises(RecipeError, match="getmoto/moto"):
        unknown.require_recipe()
    bad_version = r.resolve(_task("sympy/sympy", "0.0.1"))
    assert "no spec for sympy/sympy version '0.0.1'" in (bad_version.recipe_error or "")
    assert "1.1" in (bad_version.recipe_error or "")  # the known versions are listed


def test_recipes_file_comes_first(tmp_path: Path) -> None:
    f = tmp_path / "recipes.toml"
    f.write_text('[ "getmoto/moto"."4.1" ]\npython = "3.11"\npip = ["pytest==8.3.4"]\ninstall = ["pip install -e ."]\n'
                 'test_cmd = "pytest -rA {tests}"\nlog_parser = "swebench-pytest"\n\n'
                 '[ "sympy/sympy"."*" ]\npython = "3.11"\ntest_cmd = "bin/test -C --verbose {tests}"\nlog_parser = "swebench:sympy/sympy"\n')
    r = RecipeResolver(recipes=f)
    moto = r.resolve(_task("getmoto/moto", "4.1")).recipe
    assert moto is not None and moto.pip == ("pytest==8.3.4",) and moto.source == "recipes file getmoto/moto 4.1"
    sym = r.resolve(_task("sympy/sympy", "1.1")).recipe
    assert sym is not None and sym.python == "3.11" and sym.source == "recipes file sympy/sympy *"
    # A row's own recipe wins over both.
    own = r.resolve(_task("sympy/sympy", "1.1", recipe={"python": "3.13"})).recipe
    assert own is not None and own.python == "3.13" and own.source == "row"
    (tmp_path / "bad.json").write_text(json.dumps({"o/r": {"*": {"nope": 1}}}))
    with pytest.raises(RecipeError, match="nope"):
        load_recipes_file(tmp_path / "bad.json")


def test_pins_become_constraints_with_their_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    pin = pins.Pin("sympy/sympy", ("1.1",), "flake8<7", "an example reason", "an example source")
    monkeypatch.setattr(pins, "PINS", (pin,))
    r = recipe_from_spec(_task("sympy/sympy", "1.1"), None)
    assert r.constraints == ("flake8<7",)
    assert r.notes == ("flake8<7: an example reason (source: an example source)",)
    assert recipe_from_spec(_task("sympy/sympy", "1.2"), None).constraints == ()
    for p in pins.PINS:  # the real pins: each names its failure and where the bound comes from
        assert p.requirement and p.why and p.source


def test_mirror_layouts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("x\n")
    init_repo(src, tmp_path / "work")
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp_path / "work"), str(tmp_path / "m" / "o+r" / "repo")], check=True)
    assert _task("o/r", "1").find_repo(tmp_path / "m") == tmp_path / "m" / "o+r" / "repo"


def test_swaps_replace_conda_builds_pypi_lacks() -> None:
    """scikit-learn 1.3's spec asks conda for numpy 1.19.2 and scipy 1.5.2 on Python 3.9; PyPI
    has no cp39 wheel of either, so the first releases of those lines that have one stand in,
    each noted with why and where from."""
    from sandgym.swe.specs import recipe_from_spec

    t = SWETask(instance_id="scikit-learn__scikit-learn-25747", repo="scikit-learn/scikit-learn", base_commit="2c86" * 10,
                version="1.3")
    r = recipe_from_spec(t, None)
    assert "numpy==1.19.3" in r.pip and "scipy==1.5.4" in r.pip and "numpy==1.19.2" not in r.pip
    assert any(n.startswith("numpy==1.19.2 -> numpy==1.19.3: ") and "cp39" in n for n in r.notes)
    # Another version of the repository keeps its spec as it is.
    r = recipe_from_spec(t.model_copy(update={"version": "0.22"}), None)
    assert not any("->" in n for n in r.notes)


def test_tox_current_env_commands_are_recognised() -> None:
    from sandgym.swe.images import tox_current_env

    assert tox_current_env("tox --current-env -epy39 -v -- {tests}") == "py39"
    assert tox_current_env("tox --current-env -e py311 -- x") == "py311"
    assert tox_current_env("pytest -rA") is None and tox_current_env("tox -epy39") is None
