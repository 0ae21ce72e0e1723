"""Calling user functions (reward functions, tools, hooks) with only the arguments they name."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any


def wanted_kwargs(func: Callable[..., Any], available: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of `available` that `func` names; everything when it takes **kwargs."""
    takes_all, names = _plan(func)
    if takes_all:
        return dict(available)
    return {name: available[name] for name in names if name in available}


_Plan = tuple[bool, tuple[str, ...]]
_PLANS: dict[tuple[Any, bool], _Plan] = {}
_MAX_PLANS = 4096


def _plan(func: Callable[..., Any]) -> _Plan:
    """(takes **kwargs, the names it can take by keyword), worked out once per function
    (inspect.signature on every reward call showed in profiles). Bound methods share
    their function's entry (so no instance is kept alive here)."""
    inner = getattr(func, "__func__", None)
    key = (inner, True) if inner is not None else (func, False)
    try:
        return _PLANS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable object
        return _signature_plan(func)
    plan = _signature_plan(func)
    if len(_PLANS) < _MAX_PLANS:  # functions made per call must not grow it without bound
        _PLANS[key] = plan
    return plan


def _signature_plan(func: Callable[..., Any]) -> _Plan:
    params = inspect.signature(func).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return True, ()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return False, tuple(p.name for p in params if p.kind in keyword)


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


async def call_with_named(func: Callable[..., Any], available: Mapping[str, Any]) -> Any:
    """Call sync or async `func` with the named arguments it asks for."""
    return await maybe_await(func(**wanted_kwargs(func, available)))
