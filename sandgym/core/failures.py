"""Typed rollout failures: why a rollout ended in `State.error`.

A failed rollout is never the policy's verdict: its sandbox died, the model server failed
after retries, the environment's own code raised, it ran past its time limit, or a reward
function crashed or ran past its time limit. Each gets a kind, so evaluations report an
infrastructure-failure rate and the trainer masks such rollouts out of the loss instead of
teaching "reward 0".

The cause is kept: what a task group (anyio) wrapped in an exception group is unwrapped
before the failure is named and classified, so a multi-turn rollout reports the
`ModelError: ... Error code: 500` its single-turn twin reports, not "unhandled errors in a
TaskGroup".
"""

from __future__ import annotations

import asyncio
import sys
from typing import Literal, get_args

from sandgym.sandboxes.errors import SandboxError

from .clients import ModelError

ErrorKind = Literal["sandbox", "model", "environment", "timeout", "scoring"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)


class ScoringTimeout(TimeoutError):
    """A scoring step (tests, a checker, a judge) ran past its time limit without the policy's
    code having used its own limits (e.g. a CPU-time limit): the machine was too slow or
    too loaded to decide. The rollout's verdict is unknown: an infrastructure failure of
    kind "timeout", never a 0 for the policy."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, its nested groups flattened; `[exc]` for
    any other exception. Cancellations that a task group collected beside the real failure
    are left out, unless nothing else is there."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    out = [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    real = [e for e in out if not _is_cancellation(e)]
    return real or out


def _is_cancellation(exc: BaseException) -> bool:
    # Asked outside any event loop too (the CLI names an error after anyio.run returned).
    if isinstance(exc, asyncio.CancelledError):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.Cancelled)


def error_text(exc: BaseException) -> str:
    """One failure as a message: `Type: message (caused by Type: message)`, for the
    exception an exception group wraps; a group of several names the others' count and first."""
    found = leaves(exc)
    text = _one_text(found[0])
    if len(found) > 1:
        text += f" (and {len(found) - 1} more; the next: {_one_text(found[1])})"
    return text[:2000]


def _one_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None and str(cause) not in text:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def classify(exc: BaseException, *, default: ErrorKind = "environment") -> ErrorKind:
    """The kind of a rollout failure, from the exception (an exception group's leaves) and
    their causes: a sandbox error anywhere wins (a reward function that failed because its
    sandbox was lost is a sandbox failure), then a model error, then a timeout (the
    rollout's own limit, or a scoring step's: ScoringTimeout)."""
    chain = [e for leaf in leaves(exc) for e in _chain(leaf)]
    if any(isinstance(e, SandboxError) for e in chain):
        return "sandbox"
    if any(isinstance(e, ModelError) for e in chain):
        return "model"
    if any(isinstance(e, TimeoutError) for e in chain):
        return "timeout"
    return default
