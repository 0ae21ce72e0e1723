"""What `sandgym train` and `sandgym sft` share: their config options, logging through rich,
and reading a TOML config with the command line's overrides (`--set section.key=VALUE`,
`--steps`, `--output`), a bad config becoming one line that names the file."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console

from sandgym.errors import UserError

C = TypeVar("C")

StepsOpt = Annotated[Optional[int], typer.Option(help="override optim.steps")]
OutputOpt = Annotated[Optional[Path], typer.Option(help="override output.dir")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override any field: section.key=JSON value")]
VerboseOpt = Annotated[bool, typer.Option("-v", help="log at INFO; show the traceback of an error")]


def rich_logging(verbose: bool) -> Console:
    """Log through rich at INFO with `-v`, else WARNING; the console to print on."""
    from rich.logging import RichHandler

    console = Console()
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[RichHandler(console=console)], format="%(message)s")
    return console


def overrides(sets: Sequence[str] | None, *, steps: int | None = None, output: Path | None = None) -> dict[str, Any]:
    """`--set section.key=VALUE` (VALUE read as JSON, else taken as a string), then `--steps`
    and `--output`, as `{"section.key": value}`."""
    out: dict[str, Any] = {}
    for item in sets or ():
        key, _, raw = item.partition("=")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    if steps is not None:
        out["optim.steps"] = steps
    if output is not None:
        out["output.dir"] = str(output.resolve())
    return out


def read_config(read: Callable[[Path, dict[str, Any]], C], path: Path, overrides: dict[str, Any]) -> C:
    """`read(path, overrides)` (a config class's `from_toml`), a malformed file, an invalid
    field or options that cannot work together becoming a UserError naming the file."""
    import tomllib

    from pydantic import ValidationError

    from sandgym.cli.errors import format_validation_error
    from sandgym.train.config import ConfigError

    try:
        return read(path, overrides)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: malformed TOML: {exc}") from exc
    except ValidationError as exc:
        raise UserError(f"{path}: {format_validation_error(exc)}") from exc
    except ConfigError as exc:  # options that cannot work together
        raise UserError(f"{path}: {exc}") from exc
