"""SWE-bench-style tasks: offline task images, debug runs against gold patches, and an
agentic environment on the same tasks (see debug.py and agentic.py)."""

from .tasks import Recipe, SWETask, load_tasks

__all__ = ["Recipe", "SWETask", "load_tasks"]
