"""Competitive-programming rows as judge problems: LiveCodeBench, DeepCoder, CodeContests,
TACO and APPS (their Hugging Face row layouts), loaded with `datasets` by name or from a
local .jsonl / .json / .parquet file; plus sandgym's own Problem JSON.

Row layouts read here:
- lcb (livecodebench/code_generation_lite): question_title, question_content, question_id,
  starter_code, public_test_cases / private_test_cases (JSON lists of {input, output,
  testtype: stdin|functional}; private ones may be base64(zlib(pickle(json)))), metadata
  (JSON, func_name). Functional inputs are one JSON value per line (one per argument).
- deepcoder (agentica-org/DeepCoder-Preview-Dataset): problem, tests (JSON: a list of
  {input, output, testtype|type} -- stdin / stdin_stdout / functional / function_call -- or
  a TACO-style {inputs, outputs, fn_name}), starter_code, metadata (JSON, func_name).
- codecontests (deepmind/code_contests): name, description, public_tests / private_tests /
  generated_tests ({input: [...], output: [...]}), solutions ({language: [...], solution:
  [...]}, 3 = Python 3), time_limit ({seconds, nanos}), memory_limit_bytes.
- taco (BAAI/TACO) and apps (codeparrot/apps): question, solutions (JSON list),
  input_output (JSON {inputs, outputs, fn_name?}), starter_code; TACO adds time_limit
  ("2 seconds") and memory_limit ("256 megabytes"). Call answers are wrapped in a list.
- sandgym: a Problem as JSON (`Problem.model_dump()`).

Default comparisons follow each benchmark's own harness: LiveCodeBench and DeepCoder compare
tokens, numbers by value (float mode, tolerance 0); APPS/TACO allow 1e-5 on numbers;
CodeContests compares whitespace-separated tokens.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .model import Problem, TestCase

FORMATS = ("lcb", "deepcoder", "codecontests", "taco", "apps", "sandgym")
PYTHON3 = 3  # CodeContests' language enum


class _NoGlobals(pickle.Unpickler):
    """LiveCodeBench pickles plain strings: refuse anything that names a class or function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a test-case blob")


def _lcb_tests(blob: Any) -> list[dict[str, Any]]:
    if isinstance(blob, list):
        return blob
    if not blob:
        return []
    try:
        return json.loads(blob)
    except (json.JSONDecodeError, TypeError):
        raw = zlib.decompress(base64.b64decode(blob.encode() if isinstance(blob, str) else blob))
        return json.loads(_NoGlobals(io.BytesIO(raw)).load())


def _json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v


def _text(v: Any) -> str:
    """stdin/stdout text: some datasets store a list of lines."""
    if isinstance(v, list):
        return "\n".join(str(x) for x in v) + "\n"
    return str(v)


def _call_args(v: Any) -> str:
    """Call arguments as a JSON list: from a list, or LiveCodeBench's one-JSON-value-per-line text."""
    if isinstance(v, list):
        return json.dumps(v)
    lines = [line for line in str(v).split("\n") if line.strip()]
    return json.dumps([json.loads(line) for line in lines])


def _call_output(v: Any) -> str:
    if isinstance(v, str):
        try:
            return json.dumps(json.loads(v))
        except json.JSONDecodeError:
            return json.dumps(v)
    return json.dumps(v)


def _seconds(v: Any, default: float) -> float:
    if isinstance(v, Mapping):
        s = float(v.get("seconds") or 0) + float(v.get("nanos") or 0) / 1e9
        return s or default
    if isinstance(v, (int, float)) and v > 0:
        return float(v)
    if isinstance(v, str):
        m = re.search(r"([\d.]+)\s*(ms|millisecond|s|sec|second)?", v)
        if m:
            x = float(m.group(1))
            return x / 1000 if (m.group(2) or "").startswith("m") else x
    return default


def _megabytes(v: Any, default: int) -> int:
    if isinstance(v, (int, float)) and v > 0:
        return max(16, int(v) // (1 << 20)) if v > 1 << 16 else int(v)
    if isinstance(v, str):
        m = re.search(r"([\d.]+)", v)
        if m:
            return max(16, int(float(m.group(1))))
    return default


def _io_tests(io_spec: Mapping[str, Any]) -> tuple[list[TestCase], str | None]:
    fn = io_spec.get("fn_name")
    ins, outs = io_spec.get("inputs") or [], io_spec.get("outputs") or []
    if fn:
        return [TestCase(input=_call_args(i), output=_call_output(o)) for i, o in zip(ins, outs, strict=False)], fn
    return [TestCase(input=_text(i), output=_text(o)) for i, o in zip(ins, outs, strict=False)], None


def from_lcb(row: Mapping[str, Any], index: int) -> Problem:
    tests = _lcb_tests(row.get("public_test_cases")) + _lcb_tests(row.get("private_test_cases"))
    meta = _json(row.get("metadata") or "{}") or {}
    functional = bool(tests) and tests[0].get("testtype") == "functional"
    cases = [
        TestCase(input=_call_args(t["input"]), output=_call_output(t["output"])) if functional
        else TestCase(input=t["input"], output=t["output"])
        for t in tests
    ]  # fmt: skip
    return Problem(
        id=str(row.get("question_id") or f"lcb_{index}"),
        statement=str(row.get("question_content") or ""),
        kind="call" if functional else "stdin",
        fn_name=meta.get("func_name") if functional else None,
        starter_code=str(row.get("starter_code") or ""),
        tests=cases,
        time_limit_s=6.0,  # LiveCodeBench's own per-test timeout
        compare="float",
        float_tol=0.0,
        source="lcb",
    )


def from_deepcoder(row: Mapping[str, Any], index: int) -> Problem:
    tests = _json(row.get("tests"))
    meta = _json(row.get("metadata") or "{}") or {}
    fn_name = meta.get("func_name") if isinstance(meta, Mapping) else None
    unwrap = False
    if isinstance(tests, Mapping):  # TACO-style
        cases, fn = _io_tests(tests)
        fn_name, unwrap = fn or fn_name, bool(fn)
    else:
        cases = []
        for t in tests or []:
            kind = t.get("testtype") or t.get("type") or "stdin"
            if kind in ("functional", "function_call"):
                fn_name = t.get("fn_name") or fn_name
                cases.append(TestCase(input=_call_args(t["input"]), output=_call_output(t["output"])))
            else:
                cases.append(TestCase(input=_text(t["input"]), output=_text(t["output"])))
    is_call = fn_name is not None and bool(cases) and cases[0].input.startswith("[")
    return Problem(
        id=str(row.get("id") or row.get("problem_id") or f"deepcoder_{index}"),
        statement=str(row.get("problem") or row.get("question") or ""),
        kind="call" if is_call else "stdin",
        fn_name=fn_name if is_call else None,
        starter_code=str(row.get("starter_code") or ""),
        tests=cases,
        time_limit_s=6.0,
        compare="float",
        float_tol=0.0,
        unwrap_list_answer=unwrap,
        solutions=[s for s in [row.get("solution")] if isinstance(s, str) and s],
        source="deepcoder",
    )


def from_codecontests(row: Mapping[str, Any], index: int, *, include_generated: bool = True) -> Problem:
    cases: list[TestCase] = []
    groups = ["public_tests", "private_tests"] + (["generated_tests"] if include_generated else [])
    for g in groups:
        spec = row.get(g) or {}
        cases += [TestCase(input=i, output=o) for i, o in zip(spec.get("input") or [], spec.get("output") or [], strict=False)]
    sols = row.get("solutions") or {}
    python = [s for lang, s in zip(sols.get("language") or [], sols.get("solution") or [], strict=False) if lang == PYTHON3]
    return Problem(
        id=str(row.get("name") or f"codecontests_{index}"),
        statement=str(row.get("description") or ""),
        tests=cases,
        time_limit_s=_seconds(row.get("time_limit"), 2.0),
        memory_mb=_megabytes(row.get("memory_limit_bytes"), 256),
        compare="whitespace",
        solutions=python,
        source="codecontests",
    )


def _from_apps_like(row: Mapping[str, Any], index: int, source: str) -> Problem:
    spec = _json(row.get("input_output") or "{}") or {}
    cases, fn = _io_tests(spec)
    sols = _json(row.get("solutions") or "[]") or []
    return Problem(
        id=str(row.get("problem_id") or row.get("id") or f"{source}_{index}"),
        statement=str(row.get("question") or ""),
        kind="call" if fn else "stdin",
        fn_name=fn,
        starter_code=str(row.get("starter_code") or ""),
        tests=cases,
        time_limit_s=_seconds(row.get("time_limit"), 4.0),
        memory_mb=_megabytes(row.get("memory_limit"), 256),
        compare="float",
        float_tol=1e-5,
        unwrap_list_answer=bool(fn),
        solutions=[s for s in sols if isinstance(s, str)],
        source=source,
    )


def from_taco(row: Mapping[str, Any], index: int) -> Problem:
    return _from_apps_like(row, index, "taco")


def from_apps(row: Mapping[str, Any], index: int) -> Problem:
    return _from_apps_like(row, index, "apps")


def detect_format(row: Mapping[str, Any]) -> str:
    keys = set(row)
    if "question_content" in keys:
        return "lcb"
    if "description" in keys and "public_tests" in keys:
        return "codecontests"
    if "input_output" in keys:
        return "taco" if keys & {"time_limit", "memory_limit", "raw_tags"} else "apps"
    if {"statement", "tests", "kind"} <= keys:
        return "sandgym"
    if "problem" in keys and "tests" in keys:
        return "deepcoder"
    raise ValueError(f"cannot tell the format of a row with keys {sorted(keys)}; pass format= one of {', '.join(FORMATS)}")


def to_problem(row: Mapping[str, Any], fmt: str | None = None, index: int = 0, **options: Any) -> Problem:
    fmt = fmt or detect_format(row)
    if fmt == "lcb":
        return from_lcb(row, index)
    if fmt == "deepcoder":
        return from_deepcoder(row, index)
    if fmt == "codecontests":
        return from_codecontests(row, index, include_generated=options.get("include_generated", True))
    if fmt == "taco":
        return from_taco(row, index)
    if fmt == "apps":
        return from_apps(row, index)
    if fmt == "sandgym":
        return Problem.model_validate(dict(row))
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _rows(source: str, *, name: str | None, split: str) -> Iterable[Mapping[str, Any]]:
    from datasets import load_dataset

    path = Path(source)
    if path.exists():
        suffix = path.suffix.lower()
        builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)
        if builder is None:
            raise ValueError(f"{source}: local files must be .jsonl, .json or .parquet")
        return load_dataset(builder, data_files=str(path), split="train")
    # A Hugging Face dataset by name (needs the Hub or a local datasets cache).
    return load_dataset(source, name, split=split)


def load_problems(
    source: str,
    *,
    format: str | None = None,
    name: str | None = None,
    split: str = "test",
    limit: int | None = None,
    include_generated: bool = True,
) -> list[Problem]:
    """Problems from a local file or a dataset name; rows without tests are skipped."""
    out: list[Problem] = []
    for i, row in enumerate(_rows(source, name=name, split=split)):
        if limit is not None and len(out) >= limit:
            break
        p = to_problem(row, format, i, include_generated=include_generated)
        if p.tests:
            out.append(p)
    return out
