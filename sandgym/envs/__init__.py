"""The catalogue of ready environments, loadable by name: `load_environment("humaneval", **kwargs)`.

A name is one of ours (`BUILTIN` below; dashes and underscores alike), a dotted module path
(`mypkg.my_env`), or an installed module (`my_env`, the verifiers convention), each exposing
`load_environment(**kwargs)`. The Environment base classes are in `sandgym.core`.

This module imports no environment: `sandgym eval --help` lists `BUILTIN` without paying for
datasets, tokenizers or the SWE tooling.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandgym.errors import UnknownNameError


@dataclass(frozen=True)
class BuiltinEnv:
    """A ready environment: its module's `load_environment(**defaults, **kwargs)`."""

    module: str
    description: str
    defaults: Mapping[str, Any] = field(default_factory=dict)


# Every environment that ships with sandgym, in `sandgym eval --help` order (a description
# fits on one 80-column help line).
BUILTIN: dict[str, BuiltinEnv] = {
    "humaneval": BuiltinEnv("sandgym.envs.humaneval", "HumanEval, one turn; tested in a sandbox."),
    "humaneval_tools": BuiltinEnv(
        "sandgym.envs.humaneval", "HumanEval with a Python REPL tool in a sandbox.", {"tools": True}
    ),
    "tool_use": BuiltinEnv("sandgym.envs.tool_use", "Chained tool calls over a seeded shop catalogue."),
    "pycalc": BuiltinEnv("sandgym.envs.pycalc", "Digit questions on sandbox-held numbers via python."),
    "swe_agent": BuiltinEnv("sandgym.envs.swe_agent", "SWE tasks with bash and a file editor."),
    "swe_debug": BuiltinEnv("sandgym.envs.swe_debug", "SWE debug runs: a step (gold patch), then tests."),
    "bfcl_v4_single_turn": BuiltinEnv(
        "sandgym.envs.bfcl", "BFCL v4 single-turn calls, BFCL's own checker.", {"kind": "single_turn"}
    ),
    "bfcl_v4_multi_turn": BuiltinEnv(
        "sandgym.envs.bfcl", "BFCL v4 multi-turn; backends run in the sandbox.", {"kind": "multi_turn"}
    ),
    "code_judge": BuiltinEnv("sandgym.envs.code_judge", "Competitive programming judge (stdin/stdout, calls)."),
    "math_python": BuiltinEnv("sandgym.envs.math_python", "reasoning-gym math with a Python tool, math-verify."),
}


def available() -> list[str]:
    return list(BUILTIN)


def load_environment(name: str, **kwargs: Any) -> Any:
    key = name.strip().replace("-", "_")
    builtin = BUILTIN.get(key)
    if builtin is not None:
        return importlib.import_module(builtin.module).load_environment(**{**builtin.defaults, **kwargs})
    try:
        mod = importlib.import_module(key)
    except ModuleNotFoundError as exc:
        if exc.name != key and not key.startswith(f"{exc.name}."):
            raise  # the module exists but one of its imports is missing
        raise UnknownNameError(
            f"unknown environment {name!r}: not one of {', '.join(available())} and no module {key!r}"
        ) from exc
    loader = getattr(mod, "load_environment", None)
    if loader is None:
        raise UnknownNameError(f"module {key!r} has no load_environment(**kwargs)")
    return loader(**kwargs)
