"""A conda spec as the venv install the image builder does.

swebench's specs for some repositories (matplotlib 3.5+, xarray) are the repository's conda
`environment.yml`: SWE-bench runs `conda env create` (or `conda create` + `conda env update`)
with it, then pip-installs the spec's `pip_packages`. Here the env is a venv, so each conda
package becomes its PyPI name (`CONDA_TO_PIP`, where the names differ), and each conda-only
package (a C library, a program, a build PyPI does not have) is named in `CONDA_ONLY` with
what stands in for it: Debian packages in the env image, or nothing, with why. A package in
neither table keeps its name (most conda-forge Python packages are PyPI's under the same name).
Version specs follow conda's match spec: `name>=1.2,!=1.3` as is, `name=1.2` -> `name==1.2`
(the rule the specs' `packages` strings already get), `name 1.2` likewise, a build string
(`=1.2=py39_0`) dropped, a channel (`conda-forge::name`) dropped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any


class CondaSpecError(ValueError):
    """An environment.yml that cannot be read as a conda environment."""


@dataclass(frozen=True)
class CondaOnly:
    """A conda package with no PyPI counterpart that installs into a venv."""

    apt: tuple[str, ...]  # Debian packages that stand in (empty: nothing does)
    why: str


CONDA_TO_PIP: dict[str, str] = {
    "matplotlib-base": "matplotlib",  # conda-forge's matplotlib without the Qt backend deps
    "pyqt": "PyQt5",  # conda-forge's pyqt is PyQt5 (5.15)
    "iris": "scitools-iris",
    "pytables": "tables",
    "python-graphviz": "graphviz",  # the Python bindings; conda's `graphviz` is the program
    "msgpack-python": "msgpack",
    "pytorch": "torch",
}

CONDA_ONLY: dict[str, CondaOnly] = {
    "python": CondaOnly((), "the spec's `python` decides the image's Python"),
    "pip": CondaOnly((), "the venv has pip"),
    "hdf5": CondaOnly((), "the HDF5 C library: PyPI's h5py, netCDF4 and tables wheels bundle their own"),
    "cdms2": CondaOnly((), "CDAT's cdms2 is on conda-forge only (never on PyPI, retired in 2023); xarray's tests "
                           "skip its conversions when it is missing (importorskip)"),
    "gtk4": CondaOnly((), "the GTK 4 C library; its Python side is pygobject (below), so matplotlib's GTK4 "
                          "backend tests skip"),
    "gtk3": CondaOnly((), "the GTK 3 C library; likewise"),
    "pygobject": CondaOnly((), "PyPI has pygobject as source only, whose build needs gobject-introspection and cairo "
                               "headers plus a display to be of use; matplotlib's GTK backend tests skip without it"),
    "wxpython": CondaOnly((), "PyPI has no Linux wheels of wxPython (building it takes about an hour); matplotlib's "
                              "wx backend tests skip without it"),
    "graphviz": CondaOnly(("graphviz",), "conda's graphviz is the program (dot), for matplotlib's docs: Debian's"),
    "cairo": CondaOnly(("libcairo2",), "the cairo C library (cairocffi loads it at run time): Debian's"),
    "ffmpeg": CondaOnly(("ffmpeg",), "the program: Debian's"),
    "imagemagick": CondaOnly(("imagemagick",), "the program: Debian's"),
    "ghostscript": CondaOnly(("ghostscript",), "the program: Debian's"),
    "compilers": CondaOnly((), "the env image has Debian's build-essential"),
    "c-compiler": CondaOnly((), "the env image has Debian's build-essential"),
    "cxx-compiler": CondaOnly((), "the env image has Debian's build-essential"),
    "pkg-config": CondaOnly(("pkg-config",), "the program: Debian's"),
    "freetype": CondaOnly(("libfreetype-dev",), "the FreeType C library: Debian's"),
    "qhull": CondaOnly(("libqhull-dev",), "the Qhull C library: Debian's"),
}

# Packages a conda env links against at run time that pip wheels do not bring.
RUNTIME_APT: dict[str, tuple[str, ...]] = {
    "cairocffi": ("libcairo2",),  # cairocffi dlopens libcairo
}

_SPEC = re.compile(r"^(?:[\w.-]+::)?([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$")


def spec_to_pip(spec: str, *, name: str | None = None) -> str:
    """One conda match spec as a pip requirement (`name`: the PyPI name, when it differs)."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise CondaSpecError(f"not a conda package spec: {spec!r}")
    extras, version = m.group(2) or "", m.group(3).strip()
    name = name or m.group(1)
    if version.startswith("=") and not version.startswith("=="):
        version = "==" + version[1:].split("=", 1)[0]  # `=1.2=build` -> `==1.2`
    elif version and version[0].isdigit():
        version = "==" + version.split()[0]  # `name 1.2 build` -> `==1.2`
    return f"{name}{extras}{version}"


def conda_to_pip(packages: str) -> list[str]:
    """A spec's conda `packages` string as pip requirements (`numpy=1.19` -> `numpy==1.19`)."""
    return [spec_to_pip(tok) for tok in shlex.split(packages)]


@dataclass
class PipEnvironment:
    """An environment.yml as pip requirements, Debian packages, and what was left out."""

    requirements: list[str] = field(default_factory=list)
    apt: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per renamed, replaced or dropped package


def _name(spec: str) -> str:
    m = _SPEC.match(spec.strip())
    return m.group(1).lower().replace("_", "-") if m else spec.strip().lower()


def environment_to_pip(yml_text: str, *, source: str = "environment.yml") -> PipEnvironment:
    """The pip side of a conda environment.yml (its `dependencies`, the `pip:` list included)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError as exc:  # swebench brings PyYAML; this is for a bare install
        raise CondaSpecError(f"reading {source} needs PyYAML ({exc})") from exc
    try:
        data: Any = yaml.safe_load(yml_text)
    except yaml.YAMLError as exc:
        raise CondaSpecError(f"{source} is not valid YAML: {exc}") from exc
    deps = data.get("dependencies") if isinstance(data, dict) else None
    if not isinstance(deps, list):
        raise CondaSpecError(f"{source} has no `dependencies` list")
    env = PipEnvironment()

    def add_apt(pkgs: tuple[str, ...]) -> None:
        env.apt += [p for p in pkgs if p not in env.apt]

    for dep in deps:
        if isinstance(dep, dict) and set(dep) == {"pip"}:
            env.requirements += [str(x).strip() for x in dep["pip"] or [] if str(x).strip()]
            continue
        if not isinstance(dep, str):
            raise CondaSpecError(f"{source}: a dependency that is neither a package nor a `pip:` list: {dep!r}")
        name = _name(dep)
        only = CONDA_ONLY.get(name)
        if only is not None:
            add_apt(only.apt)
            stand_in = f"Debian's {', '.join(only.apt)}" if only.apt else "left out"
            if name not in ("python", "pip"):
                env.notes.append(f"conda {name}: {stand_in}: {only.why}")
            continue
        pip_name = CONDA_TO_PIP.get(name)
        if pip_name:
            env.notes.append(f"conda {name} -> pip {pip_name}")
        env.requirements.append(spec_to_pip(dep, name=pip_name))
        add_apt(RUNTIME_APT.get(name, ()))
    return env
