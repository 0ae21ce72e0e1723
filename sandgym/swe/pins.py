"""Pins for what drifted since SWE-bench built its images.

swebench's specs leave most dependencies unpinned (`pytest`, the repo's own requirements,
`pip install -e .[dev]`), so a build today resolves to releases the instance never saw.
Each pin below is a pip constraint applied to every install of a task's build, with the
failure it prevents (seen in a real run here) and where the bound comes from. Pins apply
by repository and swebench spec version; `*` matches every repository. Swaps replace a
spec's conda package that pip cannot install on the spec's Python by the nearest release
that it can, likewise with why and where from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pin:
    repo: str  # owner/name, or "*"
    versions: tuple[str, ...] | None  # swebench spec versions; None: all
    requirement: str  # one pip constraint line
    why: str  # the failure it prevents
    source: str  # where the bound comes from


PINS: tuple[Pin, ...] = (
    Pin("pydicom/pydicom", ("1.0", "1.1", "1.2", "1.3", "1.4", "2.0", "2.1", "2.2", "2.3"), "pytest<8",
        "pydicom's tests up to 2.3 use nose-style `def setup(self)` (about 100 of them); pytest 8 no longer calls "
        "it, so PASS_TO_PASS tests fail with AttributeError (seen: pydicom__pydicom-1413, 2 tests)",
        "pytest 8.0.0 changelog (2024-01-27): nose support removed, deprecated since 7.2; the instances were "
        "validated with pytest 7, and pydicom 2.4 (no nose-style setup left) is not pinned"),
    Pin("sphinx-doc/sphinx", tuple(f"{m}.{n}" for m, ns in ((1, range(5, 9)), (2, range(0, 5)), (3, range(0, 6))) for n in ns),
        "docutils<0.22",
        "Sphinx up to 3.5 asks for `docutils>=0.12` with no upper bound, and its LaTeX writer imports "
        "`docutils.utils.roman` (else the `roman` package, which nothing installs); docutils 0.22 and later have no "
        "such module, so every test importing the LaTeX writer fails. Sphinx 4.0 bounds docutils (<0.18) itself",
        "docutils 0.22 release notes (2025-07-29): `docutils.utils.roman` removed, now `docutils.utils._roman_numerals`; "
        "SWE-bench's images (2024) had docutils 0.21.2, the last release with it"),
)


_XARRAY = ("0.12", "0.18", "0.19", "0.20", "2022.03", "2022.06", "2022.09", "2023.07", "2024.05")
PINS += (
    Pin("pydata/xarray", _XARRAY, "setuptools_scm<10",
        "xarray's setup.cfg has `setup_requires = setuptools_scm` (unbounded), fetched at `pip install -e .`; "
        "setuptools_scm 10 needs vcs-versioning, which needs packaging>=26.2, against the spec's packaging==23.1: "
        "the install fails (seen: pydata__xarray-4248, `pip wheel ... packaging>=26.2` exit 1)",
        "PyPI metadata: setuptools_scm 10.3.4 requires vcs-versioning>=2.5 (vcs-versioning 2.6.0: packaging>=26.2); "
        "9.2.2 requires packaging>=20. SWE-bench's images (2024) predate setuptools_scm 10"),
)


def pins_for(repo: str, version: str) -> list[Pin]:
    return [p for p in PINS if p.repo in (repo, "*") and (p.versions is None or version in p.versions)]


@dataclass(frozen=True)
class Swap:
    """A spec's conda package that pip cannot install on the spec's Python: conda-forge built
    it, PyPI has no wheel of that release for that Python (and its source no longer builds
    with today's tools), so the nearest release of the same line that has one stands in."""

    repo: str
    versions: tuple[str, ...]
    python: str
    old: str  # the requirement as the spec gives it (after conda -> pip)
    new: str
    why: str
    source: str


_SKLEARN_13 = ("1.3", "1.4", "1.5", "1.6")
SWAPS: tuple[Swap, ...] = (
    Swap("scikit-learn/scikit-learn", _SKLEARN_13, "3.9", "numpy==1.19.2", "numpy==1.19.3",
         "numpy 1.19.2 has no CPython 3.9 wheel on PyPI, and its sdist does not build with Cython 3 (the env build "
         "fails cythonizing _sfc64.pyx)", "PyPI: numpy 1.19.3 (2020-10-28) is the first release with cp39 wheels; "
         "SWE-bench's conda env took conda-forge's numpy 1.19.2 build for Python 3.9"),
    Swap("scikit-learn/scikit-learn", _SKLEARN_13, "3.9", "scipy==1.5.2", "scipy==1.5.4",
         "scipy 1.5.2 has no CPython 3.9 wheel on PyPI", "PyPI: scipy 1.5.4 (2020-11-04) is the first release with "
         "cp39 wheels (1.5.3 has none); SWE-bench's conda env took conda-forge's scipy 1.5.2 build"),
)


def swaps_for(repo: str, version: str, python: str) -> list[Swap]:
    return [s for s in SWAPS if s.repo == repo and version in s.versions and s.python == python]


@dataclass(frozen=True)
class PythonSwap:
    """A spec's Python that no Debian release here ships (the images are Debian's Python):
    the nearest one that does stands in."""

    repo: str
    versions: tuple[str, ...]
    old: str
    new: str
    why: str
    source: str


PYTHON_SWAPS: tuple[PythonSwap, ...] = (
    PythonSwap("pydata/xarray", _XARRAY, "3.10", "3.9",
               "no Debian release ships Python 3.10 (bullseye has 3.9, bookworm 3.11); 3.9 rather than 3.11 because "
               "every `pip_packages` pin of xarray 0.12 has a cp39 wheel (numpy 1.23.0 has no cp311 one) and the "
               "2019-2020 code of 0.12 predates 3.11's removals",
               "Debian: python3 3.9.2 in bullseye, 3.11.2 in bookworm; SWE-bench's conda env had 3.10; PyPI: numpy "
               "1.23.2 is the first release with cp311 wheels"),
)


def python_swap_for(repo: str, version: str, python: str) -> PythonSwap | None:
    return next((s for s in PYTHON_SWAPS if s.repo == repo and version in s.versions and s.old == python), None)


@dataclass(frozen=True)
class StepSwap:
    """Spec build steps that cannot run here as written (they download from hosts other than
    PyPI and Debian): the steps matching `drop` are removed, `apt` goes into the env image,
    `add` runs in their place (before the install), `env` is set for the build and tests."""

    repo: str
    versions: tuple[str, ...]
    drop: tuple[str, ...]  # regexes over pre_install commands
    apt: tuple[str, ...]
    add: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    why: str
    source: str


_MPL_CFG = "/opt/task/mplsetup.cfg"
_MPL_APT = ("imagemagick", "ffmpeg", "texlive", "texlive-latex-extra", "texlive-fonts-recommended", "texlive-xetex",
            "texlive-luatex", "cm-super", "dvipng")
STEP_SWAPS: tuple[StepSwap, ...] = (
    StepSwap("matplotlib/matplotlib", ("3.5", "3.6", "3.7", "3.8", "3.9"),
             drop=(r"^apt-get .*install", r"QHULL", r"qhull"),
             apt=(*_MPL_APT, "pkg-config", "libfreetype-dev", "libqhull-dev"),
             add=(f"printf '[libs]\\nsystem_freetype = True\\nsystem_qhull = True\\n' > {_MPL_CFG}",),
             env=(("MPLSETUPCFG", _MPL_CFG),),
             why="the spec downloads Qhull from qhull.org (wget into build/, one shell variable per step), and "
                 "matplotlib's build downloads FreeType 2.6.1; neither host is reachable here. Debian's FreeType and "
                 "Qhull (2020.2, the release the spec fetches) are built against instead, through mplsetup.cfg "
                 "(MPLSETUPCFG). The spec's apt packages (TeX Live, ffmpeg, ImageMagick) go into the env image, the "
                 "same packages once per env rather than once per row. Image comparisons that depend on FreeType's "
                 "rasterizing can differ from SWE-bench's (2.6.1)",
             source="swebench 4.1 spec for matplotlib 3.5-3.9 (pre_install); matplotlib's setupext.py and "
                    "mplsetup.cfg.template (system_freetype, system_qhull); Debian bookworm: libqhull-dev 2020.2"),
)


def step_swaps_for(repo: str, version: str) -> list[StepSwap]:
    return [s for s in STEP_SWAPS if s.repo == repo and version in s.versions]
