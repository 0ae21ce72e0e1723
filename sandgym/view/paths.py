"""Confining file access to a run folder: a relative path from a request becomes a file
under the folder or nothing (`..`, absolute paths, NUL bytes and symlinks that lead out
are refused)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class OutsideRunError(ValueError):
    """The path does not name a file inside the run folder."""


def confine(root: Path, rel: str) -> Path:
    """`root/rel`, resolved, when it is a file inside `root` (itself resolved); else
    OutsideRunError. Symlinks are followed and the target checked, so a link inside the
    run folder that points elsewhere is refused too."""
    if not rel or "\x00" in rel or "\\" in rel:
        raise OutsideRunError(f"not a path inside the run: {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts):
        raise OutsideRunError(f"not a path inside the run: {rel!r}")
    base = root.resolve()
    target = (base / pure).resolve()
    if target != base and base not in target.parents:
        raise OutsideRunError(f"not a path inside the run: {rel!r}")
    if not target.is_file():
        raise FileNotFoundError(rel)
    return target
