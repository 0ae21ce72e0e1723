"""Calling user functions (reward functions, tools, hooks) with only the arguments they name."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any


def wanted_kwargs(func: Callable[..., Any], available: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of `available` that `func` names; everything when it takes **kwargs."""
    sig = inspect.signature(func)
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(available)
    return {
        name: available[name]
        for name, p in params.items()
        if name in available and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


async def call_with_named(func: Callable[..., Any], available: Mapping[str, Any]) -> Any:
    """Call sync or async `func` with the named arguments it asks for."""
    return await maybe_await(func(**wanted_kwargs(func, available)))
