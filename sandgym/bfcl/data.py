"""BFCL v4 entries from the installed `bfcl-eval` package, prepared as BFCL's inference does
for a function-calling model (OpenAI chat-completions style), plus what its checkers need."""

from __future__ import annotations

import copy
import functools
import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

BFCL_VERSION = "2026.3.23"  # the same pin as images/bfcl/Dockerfile
BFCL_IMAGE = "sandgym/bfcl:latest"
# The BFCL model registry entry whose conventions match OpenAI-style tool calls: results are
# decoded as {name: json-arguments} and "." in function names becomes "_" (OpenAI forbids
# dots). Results are scored, and exported, under this name.
BFCL_MODEL = "gpt-4o-2024-11-20-FC"

SINGLE_TURN_CATEGORIES: tuple[str, ...] = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "irrelevance", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
    "live_irrelevance", "live_relevance",
)  # fmt: skip
MULTI_TURN_CATEGORIES: tuple[str, ...] = (
    "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context",
)  # fmt: skip
# No ground truth: the model must (relevance) or must not (irrelevance) call a function.
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
# Entries of bfcl-eval 2026.3.23 that no output passes under BFCL's own checker: the ground
# truth contradicts the function doc or itself. The oracle fails them, and `bfcl evaluate`
# fails the oracle's output for them too (tests/bfcl checks both).
UNSCORABLE: dict[str, str] = {
    "simple_java_36": "ArrayList<any> elements are parsed as strings; the answer holds an int and a boolean",
    "simple_java_65": "ArrayList<any> elements are parsed as strings; the answer holds booleans",
    "simple_java_64": "a HashMap value in the answer is a bare string, not a list of options",
    "live_simple_106-63-0": "a required parameter has an empty list of accepted values",
    "live_simple_112-68-0": "a required parameter has an empty list of accepted values",
    "live_multiple_507-149-4": "a required parameter may only be left out",
    "live_multiple_862-181-3": "the answer passes a parameter the function does not have",
    "live_multiple_964-207-0": "the answer names a parameter the function does not have, not its required one",
}
# Short names accepted for `categories=`.
GROUPS: dict[str, tuple[str, ...]] = {
    "single_turn": SINGLE_TURN_CATEGORIES,
    "non_live": SINGLE_TURN_CATEGORIES[:7],
    "live": SINGLE_TURN_CATEGORIES[7:],
    "multi_turn": MULTI_TURN_CATEGORIES,
}


class BFCLNotInstalled(RuntimeError):
    pass


def _project_root() -> Path:
    # bfcl_eval makes result/, score/ and .file_locks/ under BFCL_PROJECT_ROOT at import time;
    # by default that is site-packages. Point it at a cache folder instead.
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sandgym" / "bfcl"


@functools.cache
def bfcl_module(name: str) -> ModuleType:
    """Import `bfcl_eval.<name>` from the host install, checking its version."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(_project_root()))
    try:
        from importlib.metadata import PackageNotFoundError, version

        installed = version("bfcl-eval")
    except PackageNotFoundError:
        raise BFCLNotInstalled(
            f"bfcl-eval is not installed: `pip install --no-deps bfcl-eval=={BFCL_VERSION} tree-sitter==0.21.3 "
            "tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4` (scripts/bootstrap.sh does it); "
            "its own pins would downgrade numpy and more, and the host needs only its data"
        ) from None
    if installed != BFCL_VERSION:
        raise BFCLNotInstalled(
            f"bfcl-eval {installed} is installed, sandgym's BFCL environments are pinned to {BFCL_VERSION} "
            "(the sandgym/bfcl image has that version; host and sandbox must read the same data)"
        )
    return importlib.import_module(f"bfcl_eval.{name}")


def categories(spec: str | list[str] | tuple[str, ...] | None, allowed: tuple[str, ...]) -> list[str]:
    """Category names from a list, a comma-separated string, or a group name."""
    if spec is None:
        return list(allowed)
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for item in items:
        names = GROUPS.get(item, (item,))
        for n in names:
            if n not in allowed:
                raise ValueError(f"unknown BFCL category {n!r} here; choose from {', '.join(allowed)} or {', '.join(GROUPS)}")
            if n not in out:
                out.append(n)
    return out


def language(category: str) -> str:
    if "javascript" in category:
        return "javascript"
    return "java" if "java" in category else "python"


@dataclass
class Entry:
    """One BFCL test entry."""

    id: str
    category: str
    turns: list[list[dict[str, Any]]]  # user messages per turn (BFCL's `question`)
    functions: list[dict[str, Any]]  # function docs offered from the start (with BFCL's hints)
    missed_function: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # turn -> docs added then
    ground_truth: Any = None  # possible answers (single-turn) / call strings per turn (multi-turn)
    eval_entry: dict[str, Any] = field(default_factory=dict)  # the prompt entry BFCL's checker reads

    @property
    def multi_turn(self) -> bool:
        return self.category.startswith("multi_turn")


@functools.cache
def load_entries(category: str) -> tuple[Entry, ...]:
    """Every entry of a category: the prompt side as `bfcl generate` prepares it (language
    hints in the function docs, multi-turn function docs filled in), the checker side as
    `bfcl evaluate` loads it (no hints), and the ground truth aligned by position."""
    utils = bfcl_module("utils")
    prompted = utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=True)
    plain = utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    truth: list[Any] = [None] * len(plain)
    if category not in RELEVANCE_CATEGORIES:
        gt = utils.load_ground_truth_entry(category)
        if len(gt) != len(plain):
            raise ValueError(f"BFCL {category}: {len(gt)} ground-truth entries for {len(plain)} prompts")
        truth = [g["ground_truth"] for g in gt]
    out = []
    for p, e, t in zip(prompted, plain, truth, strict=True):
        if p["id"] != e["id"]:
            raise ValueError(f"BFCL {category}: entries out of order ({p['id']} vs {e['id']})")
        out.append(
            Entry(
                id=p["id"],
                category=category,
                turns=p["question"],
                functions=p["function"],
                missed_function=p.get("missed_function") or {},
                ground_truth=t,
                eval_entry=e,
            )
        )
    return tuple(out)


def openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's own conversion of function docs to chat-completions tools (dots in names become
    underscores, BFCL types become JSON-schema types)."""
    mh = bfcl_module("model_handler.utils")
    enums = bfcl_module("constants.enums")
    mappings = bfcl_module("constants.type_mappings")
    return mh.convert_to_tool(copy.deepcopy(functions), mappings.GORILLA_TO_OPENAPI, enums.ModelStyle.OPENAI_COMPLETIONS)


def decode_execute(model_responses: Any) -> list[str]:
    """A step's model responses ({name: json-arguments} per call) as BFCL's call strings, the
    way BFCL's function-calling handlers decode them; raises when they do not decode."""
    return bfcl_module("model_handler.utils").convert_to_function_call(model_responses)


def additional_function_prompt() -> str:
    return bfcl_module("constants.default_prompts").DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC


def step_limit() -> int:
    return int(bfcl_module("constants.default_prompts").MAXIMUM_STEP_LIMIT)
