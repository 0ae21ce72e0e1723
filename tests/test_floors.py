"""docs/architecture.md's floors hold: no module of `sandgym` imports a package on a higher
floor, anywhere in its source (top level, under TYPE_CHECKING, or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import sandgym

ROOT = Path(sandgym.__file__).parent
# The table in docs/architecture.md, bottom up. A new top-level package must be placed here.
FLOORS = {
    "errors": 1,
    "run_folder": 1,
    "uvicorn_thread": 1,
    "sandboxes": 2,
    "platform": 3,
    "core": 4,
    "swe": 5,
    "bfcl": 5,
    "judge": 5,
    "envs": 6,
    "fleet": 7,
    "train": 8,
    "models": 8,
    "view": 9,
    "cli": 10,
    "__main__": 10,
}


def imported_packages(parts: tuple[str, ...], source: str) -> list[tuple[str, int]]:
    """(top-level sandgym package, line) for every import in a module at `parts` (its path
    inside the package)."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[1], node.lineno) for a in node.names if a.name.startswith("sandgym.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's own package
                pkg = list(parts[:-1])[: len(parts) - node.level]
                mod = pkg + (node.module.split(".") if node.module else [])
                names = [mod[0]] if mod else [a.name for a in node.names]
            elif node.module == "sandgym":
                names = [a.name for a in node.names]
            elif node.module and node.module.startswith("sandgym."):
                names = [node.module.split(".")[1]]
            else:
                continue
            out += [(n, node.lineno) for n in names if n in FLOORS]
    return out


def upward_imports(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        top = parts[0].removesuffix(".py")
        if top == "__init__":
            continue  # the package's own __init__ sits above every floor
        assert top in FLOORS, f"{top}: a new top-level package; give it a floor here and in docs/architecture.md"
        for target, line in imported_packages(parts, path.read_text()):
            if FLOORS[target] > FLOORS[top]:
                found.append(f"{path.relative_to(root)}:{line} ({top}, floor {FLOORS[top]}) imports {target} (floor {FLOORS[target]})")
    return found


def test_the_checker_sees_relative_and_lazy_imports() -> None:
    src = "def f():\n    from ...core.state import State\n    import sandgym.train.loss\n"
    assert [t for t, _ in imported_packages(("sandboxes", "providers", "x.py"), src)] == ["core", "train"]
    assert [t for t, _ in imported_packages(("core", "x.py"), "from . import state\nfrom .. import swe\n")] == ["core", "swe"]


def test_nothing_imports_upward() -> None:
    assert upward_imports(ROOT) == []
