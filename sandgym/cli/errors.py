"""How the command line reports an error: a mistake of the user's (a malformed or invalid
config, an unknown name, a missing file, a bad option value, a sandbox spec out of range) as
one line on stderr and exit status 2; anything else is a bug and keeps its traceback (exit 1).
`sandgym -v` (or `-v` of `eval` and `train`) shows the traceback of a user error too."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from typing import Any, NoReturn

import typer

from sandgym.errors import UnknownNameError, UserError

USER_ERROR_EXIT = 2

_tracebacks = False


def show_tracebacks(on: bool = True) -> None:
    """Print the traceback of a user error as well (`-v`)."""
    global _tracebacks
    _tracebacks = _tracebacks or on


def _usage_error_types() -> tuple[type[Exception], ...]:
    """Click's usage errors (a bad option value, a missing file argument): newer typer
    vendors click, with `TyperException` as their base; older typer raises click's own."""
    types: list[type[Exception]] = [typer.TyperException] if hasattr(typer, "TyperException") else []
    if importlib.util.find_spec("click") is not None:
        import click

        types.append(click.ClickException)
    return tuple(types)


def is_no_args_help(exc: BaseException) -> bool:
    """A group called without a command: the exception's message is the group's help (exit 2)."""
    return type(exc).__name__ == "NoArgsIsHelpError"


def _sandbox_spec_error() -> type[Exception]:
    from sandgym.sandboxes.errors import SpecError

    return SpecError


def check_provider(name: str) -> None:
    """A sandbox provider named on the command line must exist, checked up front: an
    environment without sandboxes would otherwise never notice a typo."""
    from sandgym.sandboxes.registry import UnknownProviderError, provider_class

    try:
        provider_class(name)
    except UnknownProviderError as exc:
        raise UnknownNameError(str(exc)) from None


def format_validation_error(exc: Any) -> str:
    """A pydantic ValidationError as one line naming each bad key: `optim.lr: Input should be
    a valid number (got 'fast'); model.bogus: Extra inputs are not permitted`."""
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        text = f"{key}: {err.get('msg', 'invalid')}"
        if err.get("type") not in ("missing", "extra_forbidden") and "input" in err:
            got = repr(err["input"])
            text += f" (got {got if len(got) <= 60 else got[:57] + '...'})"
        parts.append(text)
    return f"invalid {exc.title}: " + "; ".join(parts)


def user_error_message(exc: BaseException) -> str | None:
    """The one-line message for an error that is the user's to fix, else None (a bug)."""
    import tomllib

    from pydantic import ValidationError

    from sandgym.core.failures import leaves

    # A task group (anyio) wraps what one of its tasks raised; a group of several failures
    # (cancellations aside) is not one user error.
    found = leaves(exc)
    if len(found) != 1:
        return None
    exc = found[0]
    if isinstance(exc, _usage_error_types()):
        message = exc.format_message()  # type: ignore[attr-defined]  # click's/typer's usage errors, found at runtime, all have it
        ctx = getattr(exc, "ctx", None)
        return f"{message} (see '{ctx.command_path} --help')" if ctx is not None else message
    if isinstance(exc, UserError):
        return str(exc)
    if isinstance(exc, ValidationError):
        return format_validation_error(exc)
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"malformed TOML: {exc}"
    if isinstance(exc, _sandbox_spec_error()):
        return f"invalid sandbox spec: {exc}"
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        return f"{exc.strerror or 'no such file'}: {exc.filename}"
    return None


def exit_for_user_error(exc: BaseException, message: str) -> NoReturn:
    if _tracebacks:
        traceback.print_exception(exc)
    # One line, whatever the message holds (pydantic and TOML errors span several).
    print("error: " + " ".join(message.split()), file=sys.stderr)
    sys.exit(USER_ERROR_EXIT)
