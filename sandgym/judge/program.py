"""sandgym's standard-library modules as one program for `python3 -I -c` in a sandbox that has
no sandgym installed: the judge's harness (sandbox_harness.py) and its fork server
(zygote.py), with the frame format they speak (sandgym.sandboxes.execd.framing).

The modules stay ordinary files of the package, linted and type-checked; here they are read
as text and defined in the sandbox's interpreter under their own dotted names, so that
their `from sandgym.x.y import name` lines work there as they do on the host (only that
form: no parent package exists there). Then the last one's `main()` runs.
"""

from __future__ import annotations

import importlib.util
from functools import cache

_DEFINE = '''import sys, types
def _define(name, source):
    module = sys.modules[name] = types.ModuleType(name)
    exec(compile(source, name.replace(".", "/") + ".py", "exec", dont_inherit=True), module.__dict__)
    return module
'''


@cache
def source(module: str) -> str:
    """The text of one of sandgym's modules, by dotted name (without importing it)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module {module}")
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def program(*modules: str) -> str:
    """Python source that defines `modules` in order (each may import from the ones before
    it) and runs the last one's `main()`."""
    *first, main = modules
    defines = "".join(f"_define({name!r}, {source(name)!r})\n" for name in first)
    return f"{_DEFINE}{defines}_define({main!r}, {source(main)!r}).main()\n"


FRAMING = "sandgym.sandboxes.execd.framing"
ZYGOTE = "sandgym.judge.zygote"
HARNESS = "sandgym.judge.sandbox_harness"


@cache
def harness_program() -> str:
    """The judge's harness; it also defines the zygote's module (for its constants)."""
    return program(FRAMING, ZYGOTE, HARNESS)


@cache
def zygote_program() -> str:
    """The fork server, started by the harness: framing and itself, nothing of the harness
    (which holds the expected outputs)."""
    return program(FRAMING, ZYGOTE)
