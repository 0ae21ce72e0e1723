"""The agentic SWE environment: `bash` and `str_replace_editor` in the task's sandbox; the
reward is the resolved check. Validate with no model: policy `oracle` (gold patch through
the editor) scores 1.0, `null` scores 0.

    load_environment()                               # bundled tasks without the broken one
    load_environment(tasks="tasks.jsonl", max_turns=50)
"""

from __future__ import annotations

from typing import Any

from sandgym.swe.agentic import SWEAgentEnv
from sandgym.swe.bundled import resolve_tasks
from sandgym.swe.images import TaskImageBuilder


def load_environment(
    tasks: Any = "bundled-good",
    max_turns: int = 30,
    command_timeout_s: float = 120.0,
    split: str = "test",
    mirrors: str | None = None,
    recipes: str | None = None,
    **kwargs: Any,
) -> SWEAgentEnv:
    return SWEAgentEnv(resolve_tasks(tasks, split=split), builder=TaskImageBuilder(mirrors=mirrors, recipes=recipes),
                       max_turns=max_turns, command_timeout_s=command_timeout_s, **kwargs)
