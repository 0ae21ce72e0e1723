"""Decorators marking environment methods as stop conditions, per-rollout cleanup and
environment teardown (the verifiers names: `stop`, `cleanup`, `teardown`).

    class MyEnv(MultiTurnEnv):
        @stop
        async def solved(self, state) -> bool: ...
        @cleanup
        async def drop_scratch(self, state) -> None: ...
        @teardown
        async def close_db(self) -> None: ...
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

STOP = "_sandgym_stop"
CLEANUP = "_sandgym_cleanup"
TEARDOWN = "_sandgym_teardown"


def stop(func: F) -> F:
    """A stop condition: `(self, state) -> bool` (sync or async); any true one ends the rollout."""
    setattr(func, STOP, True)
    return func


def cleanup(func: F) -> F:
    """Runs after every rollout (success, error or cancellation): `(self, state) -> None`."""
    setattr(func, CLEANUP, True)
    return func


def teardown(func: F) -> F:
    """Runs once when the environment is closed: `(self) -> None`."""
    setattr(func, TEARDOWN, True)
    return func


def marked(obj: object, mark: str) -> list[Callable[..., Any]]:
    """Bound methods of `obj` carrying `mark`, in definition order (base classes first).
    The names are worked out once per class (a class is not changed after its first
    rollout): this runs twice per rollout, and walking the MRO showed in profiles."""
    klass = type(obj)
    per_class = _MARKED.get(klass)
    if per_class is None:
        per_class = _MARKED.setdefault(klass, {})
    names = per_class.get(mark)
    if names is None:
        names = per_class[mark] = _marked_names(klass, mark)
    return [getattr(obj, name) for name in names]


def _marked_names(klass: type, mark: str) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for k in reversed(klass.__mro__):
        for name, attr in vars(k).items():
            if callable(attr) and getattr(attr, mark, False):
                seen[name] = None
            elif name in seen and not getattr(attr, mark, False):
                seen.pop(name)  # overridden without the mark: no longer one
    return tuple(seen)


_MARKED: weakref.WeakKeyDictionary[type, dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()
