"""docs/architecture.md names only what exists: its floors table is the one tests/test_floors.py
enforces, a file a floor's row names is in that floor's package, and every other path it
names is in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.test_floors import FLOORS

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
# A file or folder name: `x.py`, `cli/errors.py`, `docs/training.md`, `providers/`.
PATH = re.compile(r"(?<![\w./-])([\w*-]+(?:/[\w*-]+)*(?:\.(?:py|md|toml)|/))(?![\w/])")
TABLE_ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| (.+) \|$", re.M)


def floor_rows() -> list[tuple[int, list[str], str]]:
    """(floor, its packages, what the row says) for each row of the floors table."""
    return [
        (int(n), re.findall(r"`sandgym\.(\w+)`", packages), text)
        for n, packages, text in TABLE_ROW.findall(DOC)
    ]


def repo_paths() -> set[str]:
    """The repository's files and their folders (tracked, or new and not ignored), as posix
    paths from its root; folders end with "/"."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    out: set[str] = set()
    for f in filter(None, listed):
        out.add(f)
        parts = f.split("/")
        out.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return out


def exists_under(name: str, base: str | None, paths: set[str]) -> bool:
    """`name` (`*` matching within one path part) is at `base`, or at any depth with None."""
    body = re.escape(name).replace(r"\*", "[^/]*") + "$"
    pattern = re.compile("^" + re.escape(base) + body if base is not None else "(^|.*/)" + body)
    return any(pattern.match(p) for p in paths)


def test_the_table_is_the_floors_the_test_enforces() -> None:
    documented = {pkg: floor for floor, pkgs, _ in floor_rows() for pkg in pkgs}
    assert len(documented) >= 10  # the table was read
    assert documented == {k: v for k, v in FLOORS.items() if k != "__main__"}


@pytest.mark.parametrize(("floor", "packages", "text"), [pytest.param(*r, id=f"floor{r[0]}") for r in floor_rows()])
def test_a_floor_row_names_files_of_its_own_packages(floor: int, packages: list[str], text: str) -> None:
    paths = repo_paths()
    for name in PATH.findall(text):
        bases = [f"sandgym/{p}/" for p in packages] + (["sandgym/"] if "/" in name.rstrip("/") else [])
        assert any(exists_under(name, b, paths) for b in bases), f"floor {floor} names {name}, which is in none of {bases}"


def test_every_path_the_doc_names_exists() -> None:
    paths = repo_paths()
    names = set(PATH.findall(DOC))
    assert "run_folder.py" in names and "docs/security.md" in names  # the pattern finds them
    missing = []
    for name in sorted(names):
        if name.startswith("CONFIG.") or name == "pyproject.toml":  # placeholders for the user's own
            continue
        if not exists_under(name, None, paths):
            missing.append(name)
    assert not missing, f"docs/architecture.md names what is not in the repository: {missing}"
