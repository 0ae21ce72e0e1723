"""swebench specs that are a conda environment.yml (matplotlib 3.5+, xarray): the file read
from the local repository at environment_setup_commit, its packages as pip requirements
(renamed where PyPI's name differs, conda-only packages replaced by Debian's or left out, each
noted), the spec's pip pins as constraints, and the spec steps that download from unreachable
hosts swapped, with why. Nothing is built here."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.swe import pins
from sandgym.swe.bundled import init_repo
from sandgym.swe.conda import CONDA_ONLY, CondaSpecError, environment_to_pip, spec_to_pip
from sandgym.swe.images import env_dockerfile
from sandgym.swe.specs import RecipeResolver
from sandgym.swe.tasks import MissingRepository, Recipe, SWETask
from tests.conftest import require

require("swebench")
from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

ENV_YML = """\
# comment
name: test-env
channels:
  - conda-forge
dependencies:
  - python=3.8
  - pip
  - conda-forge::numpy=1.21=py38_0
  - matplotlib-base>=3.1
  - pyqt
  - hdf5
  - cairocffi
  - graphviz
  - sphinx>=1.8.1,!=2.0.0
  - nbconvert[execute]!=6.0.0
  - setuptools_scm
  - scipy 1.5.2
  - pip:
      - numbagg
      - mpl-sphinx-theme>=3
"""


def test_conda_match_specs_become_pip_requirements() -> None:
    assert spec_to_pip("numpy=1.21") == "numpy==1.21"
    assert spec_to_pip("numpy=1.21=py38_0") == "numpy==1.21"  # build string dropped
    assert spec_to_pip("conda-forge::numpy>=1.21") == "numpy>=1.21"  # channel dropped
    assert spec_to_pip("scipy 1.5.2") == "scipy==1.5.2"
    assert spec_to_pip("sphinx>=1.8.1,!=2.0.0") == "sphinx>=1.8.1,!=2.0.0"
    assert spec_to_pip("nbconvert[execute]!=6.0.0") == "nbconvert[execute]!=6.0.0"
    assert spec_to_pip("pyqt>=5", name="PyQt5") == "PyQt5>=5"
    with pytest.raises(CondaSpecError):
        spec_to_pip("!!")


def test_environment_yml_becomes_pip_requirements_apt_and_notes() -> None:
    env = environment_to_pip(ENV_YML)
    assert env.requirements == [
        "numpy==1.21", "matplotlib>=3.1", "PyQt5", "cairocffi", "sphinx>=1.8.1,!=2.0.0", "nbconvert[execute]!=6.0.0",
        "setuptools_scm", "scipy==1.5.2", "numbagg", "mpl-sphinx-theme>=3",
    ]
    # graphviz (the program) and cairocffi's C library come from Debian; python and pip are the venv's.
    assert env.apt == ["libcairo2", "graphviz"]
    assert "conda matplotlib-base -> pip matplotlib" in env.notes and "conda pyqt -> pip PyQt5" in env.notes
    hdf5 = [n for n in env.notes if n.startswith("conda hdf5: left out: ")]
    assert hdf5 and CONDA_ONLY["hdf5"].why in hdf5[0]
    assert not any(n.startswith(("conda python", "conda pip")) for n in env.notes)


@pytest.mark.parametrize("text, match", [
    ("name: x\n", "no `dependencies` list"),
    ("dependencies: [\n", "not valid YAML"),
    ("dependencies:\n  - {conda: x}\n", "neither a package nor a `pip:` list"),
])
def test_broken_environment_files_are_named(text: str, match: str) -> None:
    with pytest.raises(CondaSpecError, match=match):
        environment_to_pip(text, source="o/r environment.yml")


def _repo_with(tmp_path: Path, name: str, files: dict[str, str]) -> str:
    src = tmp_path / "src"
    for path, text in files.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(text)
    return init_repo(src, tmp_path / "mirrors" / name)


def _task(repo: str, version: str, commit: str) -> SWETask:
    return SWETask.model_validate({"instance_id": f"{repo.replace('/', '__')}-1", "repo": repo, "version": version,
                                   "base_commit": commit, "environment_setup_commit": commit})


def test_xarray_spec_reads_its_environment_yml_from_the_repository(tmp_path: Path) -> None:
    """xarray 0.12: ci/requirements/environment.yml (the first of swebench's paths) at the
    environment_setup_commit, the spec's pip packages on top and, pinned, as constraints of
    the whole env install; Python 3.10, which no Debian release ships, swapped with its why."""
    commit = _repo_with(tmp_path, "pydata__xarray", {"ci/requirements/environment.yml": ENV_YML})
    spec = MAP_REPO_VERSION_TO_SPECS["pydata/xarray"]["0.12"]
    r = RecipeResolver(mirrors=tmp_path / "mirrors").resolve(_task("pydata/xarray", "0.12", commit)).recipe
    assert r is not None
    assert r.requirements.splitlines() == environment_to_pip(ENV_YML).requirements
    assert r.pip == tuple(spec["pip_packages"])
    assert set(spec["pip_packages"]) <= set(r.constraints)  # every one of them is an exact pin
    assert r.python == "3.9" and spec["python"] == "3.10"
    assert any(n.startswith("Python 3.10 -> 3.9: no Debian release ships Python 3.10") for n in r.notes)
    assert "ci/requirements/environment.yml: conda pyqt -> pip PyQt5" in r.notes
    assert r.install == (spec["install"],) and r.test_cmd == spec["test_cmd"] + " {tests}"


def test_matplotlib_spec_builds_against_debian_freetype_and_qhull(tmp_path: Path) -> None:
    """matplotlib 3.6: the qhull.org download and the per-row apt step are swapped: the apt
    packages (with pkg-config, FreeType and Qhull headers) go into the env image, and
    MPLSETUPCFG points the build at the system libraries."""
    commit = _repo_with(tmp_path, "matplotlib__matplotlib", {"environment.yml": ENV_YML})
    spec = MAP_REPO_VERSION_TO_SPECS["matplotlib/matplotlib"]["3.6"]
    r = RecipeResolver(mirrors=tmp_path / "mirrors").resolve(_task("matplotlib/matplotlib", "3.6", commit)).recipe
    assert r is not None and r.python == spec["python"]
    assert not any("wget" in c or "QHULL_" in c or "apt-get" in c for c in r.pre_install)
    assert len(r.pre_install) == 1 and "system_qhull = True" in r.pre_install[0]
    assert r.env["MPLSETUPCFG"] in r.pre_install[0]
    for pkg in ("texlive-latex-extra", "cm-super", "dvipng", "ffmpeg", "libfreetype-dev", "libqhull-dev", "pkg-config"):
        assert pkg in r.apt
    assert any(n.startswith("7 pre_install step(s) replaced: ") and "qhull.org" in n for n in r.notes)
    dockerfile = env_dockerfile(r, with_ca=False)
    assert "apt-get install -y -qq libcairo2 graphviz imagemagick" in dockerfile
    for swap in pins.STEP_SWAPS:
        assert swap.why and swap.source and swap.drop


def test_apt_changes_only_the_env_images_that_have_it() -> None:
    """Env images without Debian extras keep the hash they had before `apt` existed."""
    assert "apt" not in Recipe().env_hash_material()
    assert Recipe(apt=("graphviz",)).env_hash_material()["apt"] == ["graphviz"]
    assert "apt-get install -y -qq graphviz" not in env_dockerfile(Recipe(), with_ca=False)


def test_environment_yml_without_a_repository_says_where_it_looked(tmp_path: Path) -> None:
    t = _task("pydata/xarray", "0.12", "0" * 40)
    with pytest.raises(MissingRepository, match=r"no local repository for .* looked in .*nothing"):
        RecipeResolver(mirrors=tmp_path / "nothing").resolve(t)
    # A repository whose environment.yml is broken: that row's recipe error names the file.
    commit = _repo_with(tmp_path, "pydata__xarray", {"environment.yml": "name: x\n"})
    r = RecipeResolver(mirrors=tmp_path / "mirrors").resolve(_task("pydata/xarray", "0.12", commit))
    assert r.recipe is None and "pydata/xarray environment.yml has no `dependencies` list" in (r.recipe_error or "")
