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
)


def pins_for(repo: str, version: str) -> list[Pin]:
    return [p for p in PINS if p.repo in (repo, "*") and (p.versions is None or version in p.versions)]
