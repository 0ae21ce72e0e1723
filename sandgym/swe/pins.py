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
