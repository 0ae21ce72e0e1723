"""sandgym's modules import each other without a circle, in every package and across them:
every import counts (top level, under TYPE_CHECKING, inside functions), so a circle cannot
hide behind a lazy import. Package `__init__` files re-export and are left out of the graph
(importing `sandgym.x.y` runs `sandgym.x`'s `__init__` first, whatever the graph says)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sandgym

ROOT = Path(sandgym.__file__).parent


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of sandgym by dotted name: (its file, whether it is a package)."""
    out: dict[str, tuple[Path, bool]] = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ["sandgym", *p.relative_to(ROOT).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


MODULES = _modules()
PLAIN = sorted(m for m, (_, is_pkg) in MODULES.items() if not is_pkg)


def imports_of(module: str) -> set[str]:
    """The sandgym modules `module` imports, anywhere in its source (a name imported from a
    package counts as its submodule when there is one, else as the package)."""
    path, is_pkg = MODULES[module]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target == "sandgym" or target.startswith("sandgym."):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    out.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("sandgym."))
    return {m for m in out if m in MODULES and m != module}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for dep in sorted(graph[node]):
            found = visit(dep, path + [node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_checker_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle_anywhere() -> None:
    graph = {m: {d for d in imports_of(m) if d in PLAIN} for m in PLAIN}
    assert "sandgym.core.clients" in graph["sandgym.core.environment"]  # the graph sees real edges
    assert "sandgym.sandboxes.live" in graph["sandgym.sandboxes.base"]  # relative imports too
    packages = {m.rsplit(".", 1)[0] for m in PLAIN}
    assert len(packages) >= 20, sorted(packages)  # every package is in it, not only core
    assert find_cycle(graph) is None


@pytest.mark.parametrize("module", sorted(m for m in PLAIN if m.startswith("sandgym.core.")))
def test_each_core_module_imports_on_its_own(module: str) -> None:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
