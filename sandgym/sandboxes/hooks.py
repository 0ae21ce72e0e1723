"""Lifecycle hooks: plain or async callables run at fixed points of a sandbox's life."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from .errors import HookError

log = logging.getLogger(__name__)

HookName = Literal["on_create", "on_ready", "before_exec", "after_exec", "on_release", "on_destroy"]
HOOK_NAMES: tuple[HookName, ...] = (
    "on_create",   # (sandbox) right after the provider created it
    "on_ready",    # (sandbox) before it is handed to a caller (also for warm-pool handouts)
    "before_exec",  # (sandbox, cmd)
    "after_exec",  # (sandbox, cmd, result)
    "on_release",  # (sandbox) when a caller gives it back
    "on_destroy",  # (sandbox) just before it is destroyed
)
Hook = Callable[..., Any]


class Hooks:
    """An ordered list of callables per hook name. Sync and async callables both work."""

    def __init__(self, hooks: Mapping[str, Hook | Iterable[Hook]] | None = None) -> None:
        self._hooks: dict[str, list[Hook]] = {name: [] for name in HOOK_NAMES}
        for name, fns in (hooks or {}).items():
            for fn in [fns] if callable(fns) else list(fns):
                self.add(name, fn)

    def add(self, name: str, fn: Hook) -> Hook:
        if name not in self._hooks:
            raise ValueError(f"unknown hook {name!r}; known: {', '.join(HOOK_NAMES)}")
        self._hooks[name].append(fn)
        return fn

    def __bool__(self) -> bool:
        return any(self._hooks.values())

    def has(self, name: str) -> bool:
        return bool(self._hooks[name])

    async def run(self, name: str, *args: Any) -> None:
        """Run every hook for `name` in order; the first failure raises HookError."""
        for fn in self._hooks[name]:
            try:
                out = fn(*args)
                if inspect.isawaitable(out):
                    await out
            except Exception as exc:
                raise HookError(f"{name} hook {getattr(fn, '__name__', fn)!r} failed: {exc!r}") from exc

    async def run_quietly(self, name: str, *args: Any) -> None:
        """For teardown hooks: a failure is logged, never raised (teardown must finish)."""
        try:
            await self.run(name, *args)
        except HookError as exc:
            log.warning("%s", exc)
