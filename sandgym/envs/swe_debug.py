"""SWE debug runs as an environment: no model; each row runs one debug step (default: the
gold patch) in the task's sandbox, then the task's tests. Reward 1.0 when resolved.

    load_environment()                          # the bundled tasks, --step gold_patch
    load_environment(tasks="tasks.jsonl", step="none")
"""

from __future__ import annotations

from typing import Any

from sandgym.swe.bundled import resolve_tasks
from sandgym.swe.debug import SWEDebugEnv
from sandgym.swe.images import TaskImageBuilder


def load_environment(
    tasks: Any = "bundled",
    step: str = "gold_patch",
    command: str | None = None,
    script: str | None = None,
    split: str = "test",
    mirrors: str | None = None,
    recipes: str | None = None,
    **kwargs: Any,
) -> SWEDebugEnv:
    return SWEDebugEnv(resolve_tasks(tasks, split=split), step=step, command=command, script=script,
                       builder=TaskImageBuilder(mirrors=mirrors, recipes=recipes), **kwargs)
