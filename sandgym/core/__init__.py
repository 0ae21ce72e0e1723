"""sandgym.core: the Environment base classes, rollout state, rubrics, parsers, model clients
and offline policies. Ready environments built on these are in `sandgym.envs`.

Names follow the verifiers library (`environment.py`: Environment, MultiTurnEnv,
SingleTurnEnv; `tools.py`: ToolEnv; `sandbox_env.py`: SandboxEnv; `python_env.py`: PythonEnv; `env_group.py`:
EnvGroup):

    from sandgym.core import SingleTurnEnv, ToolEnv, PythonEnv, Rubric, XMLParser
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "State": "state", "Turn": "state", "TurnTokens": "state", "Timing": "state",
    "Environment": "environment", "MultiTurnEnv": "environment", "SingleTurnEnv": "environment",
    "ToolEnv": "tools", "StatefulToolEnv": "tools", "tool_schema": "tools", "tool_call": "tools",
    "SandboxEnv": "sandbox_env", "PythonEnv": "python_env",
    "EnvGroup": "env_group",
    "Rubric": "rubric", "GraderRubric": "rubric",
    "Parser": "parsers", "ThinkParser": "parsers", "XMLParser": "parsers", "CodeBlockParser": "parsers", "BoxedParser": "parsers",
    "stop": "decorators", "cleanup": "decorators", "teardown": "decorators",
    "OpenAIClient": "clients", "OraclePolicy": "policies", "NullPolicy": "policies", "get_policy": "policies",
    "ModelClient": "clients", "ModelResponse": "clients", "ModelError": "clients",
    "pass_at_k": "stats", "group_advantages": "stats",
    "run_eval": "evaluation", "summarize": "evaluation",
}  # fmt: skip

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - the names the lazy __getattr__ below serves


def __getattr__(name: str) -> Any:
    # Lazy, so importing sandgym.core.state (the trainer's contract) stays cheap.
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'sandgym.core' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sandgym.core.{mod}"), name)
