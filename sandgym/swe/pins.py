"""Pins for what drifted since SWE-bench built its images.

swebench's specs leave most dependencies unpinned (`pytest`, the repo's own requirements,
`pip install -e .[dev]`), so a build today resolves to releases the instance never saw.
Each pin below is a pip constraint applied to every install of a task's build, with the
failure it prevents (seen in a real run here) and where the bound comes from. Pins apply
by repository and swebench spec version; `*` matches every repository.
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
