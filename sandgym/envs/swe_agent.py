"""The agentic SWE environment: `bash` and `str_replace_editor` in the task's sandbox; the
reward is the resolved check. Validate with no model: policy `oracle` (gold patch through
the editor) scores 1.0, `null` scores 0.

    load_environment()                               # bundled tasks without the broken one
    load_environment(tasks="tasks.jsonl", max_turns=50)
    load_environment(tasks="rows.jsonl", image_source="prebuilt")   # SWE-bench's instance images
"""

from __future__ import annotations

from typing import Any

from sandgym.swe.agentic import SWEAgentEnv
from sandgym.swe.bundled import resolve_tasks
from sandgym.swe.images import TaskImageBuilder
from sandgym.swe.prebuilt import PrebuiltImages


def load_environment(
    tasks: Any = "bundled-good",
    max_turns: int = 30,
    command_timeout_s: float = 120.0,
    split: str = "test",
    mirrors: str | None = None,
    recipes: str | None = None,
    image_source: str = "build",
    registry: str | None = None,
    image_namespace: str | None = "swebench",
    **kwargs: Any,
) -> SWEAgentEnv:
    """`image_source`: `build` (task images built here from mirrors) or `prebuilt` (SWE-bench's
    instance images, from Docker Hub or `registry`, under swebench's `image_namespace`)."""
    if image_source not in ("build", "prebuilt"):
        raise ValueError(f"image_source must be build or prebuilt, not {image_source!r}")
    prebuilt = PrebuiltImages(registry=registry, namespace=image_namespace)
    return SWEAgentEnv(resolve_tasks(tasks, split=split), builder=TaskImageBuilder(mirrors=mirrors, recipes=recipes),
                       max_turns=max_turns, command_timeout_s=command_timeout_s,
                       image_source="prebuilt" if image_source == "prebuilt" else "build", prebuilt=prebuilt, **kwargs)
