"""The `sandgym` command line. Each command group lives in its own module with a
`register(app)` function; modules import their heavy dependencies lazily, inside commands,
so `sandgym --help` stays fast.

Errors: `main()` prints a user's mistake (see `errors.user_error_message`) as one line on
stderr and exits 2; a bug keeps its traceback and exits 1. `-v` shows tracebacks."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Sequence

import typer

from . import errors

app = typer.Typer(
    name="sandgym",
    help="Code-execution environments for LLM agents: sandboxes, evals, SWE debug runs, GRPO.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    # Plain click help: typer's rich help imports rich's markdown, syntax and traceback
    # modules (pygments, markdown-it: ~200 modules), most of `sandgym --help`'s start time.
    # Command output still uses rich.
    rich_markup_mode=None,
)


@app.callback()
def _options(
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show the traceback of an error (a user error is otherwise one line)."),
) -> None:
    errors.show_tracebacks(verbose)


# Command modules, in help order; each must exist and define register(app).
_COMMANDS = ("eval", "bfcl", "swe", "view", "sandbox", "images", "serve", "ray", "sft", "train", "doctor")


def _register() -> None:
    for name in _COMMANDS:
        importlib.import_module(f"sandgym.cli.{name}_cmd").register(app)


_register()


# Python collects its youngest generation every 700 allocations, and every tenth of those
# collections also walks the middle one; a process with torch or transformers loaded, or a
# long-lived server, spends a noticeable share of its CPU there. At 10,000 a 4-step GRPO run
# of the pycalc demonstration spent 0.85 s in the collector instead of 2.55 s (of ~56 CPU-s),
# and a pytest process over tests/core and tests/envs 2.0 s instead of 5.3 s (of ~31)
# (benchmarks/RESULTS.md). Garbage without cycles is freed at once either way.
GC_THRESHOLDS = (10_000, 10, 10)


def main(args: Sequence[str] | None = None) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    # Before torch loads (train, sft, eval --checkpoint): torch's OpenMP threads sleep at a
    # barrier instead of spinning, where a spinning thread burns the core that its
    # descheduled peer needs on a busy machine. `sandgym sft` of 60 steps beside two busy
    # loops: 30-53 s and 22-43 CPU-s by default, 30-40 s and 19-26 CPU-s passive; idle,
    # 16-23 s either way (benchmarks/RESULTS.md). A user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        # standalone_mode=False: click's own errors come here instead of being printed as a
        # rich panel, so every user error is reported the same way.
        rv = app(args=args, standalone_mode=False)
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:
        if errors.is_no_args_help(exc):
            print(exc.format_message())  # type: ignore[attr-defined]  # the group's help
            sys.exit(2)
        message = errors.user_error_message(exc)
        if message is None:
            raise  # a bug: typer's traceback, exit 1
        errors.exit_for_user_error(exc, message)
    # An int is an exit status (typer.Exit, Ctrl-C's 130); a command's return value is not.
    sys.exit(rv if isinstance(rv, int) else 0)
