"""Grading as SWE-bench grades: test log -> per-test statuses -> FAIL_TO_PASS / PASS_TO_PASS.

- The test log is what the eval script printed; the output between SWE-bench's markers
  (`>>>>> Start Test Output` / `>>>>> End Test Output`) is parsed, the whole log when that
  part yields nothing (swebench's `get_logs_eval`).
- The parser is the recipe's `log_parser`: `swebench` (the repo's own parser in
  swebench's `MAP_REPO_TO_PARSER`: pytest first-token ids, django, sympy's bin/test, ...),
  `swebench:<owner/name>` (another repo's), a swebench parser by name (`pytest`,
  `pytest_options`, `pytest_v2`, `django`, `sympy`, `seaborn`, `matplotlib` from
  `swebench.harness.log_parsers.python`, prefixed `swebench-`), sandgym's own `sandgym-pytest`
  / `sandgym-unittest` (sandgym.swe.testparse), or `module:function` taking the log text
  (and, optionally, swebench's TestSpec) and returning `{test id: status}`. With none set,
  the repo's swebench parser when there is one, else sandgym's parser for the recipe's
  framework.
- The report is swebench's `get_eval_tests_report` + `get_resolution_status` when the
  package is installed (identical to its report for the same log); without it (tasks with
  their own recipes), the same rules: a test passes when PASSED or XFAIL, fails when
  FAILED, ERROR or missing, and counts as neither otherwise (SKIPPED); resolved when every
  FAIL_TO_PASS and PASS_TO_PASS test passes.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, Field

from .tasks import END_TEST_OUTPUT, START_TEST_OUTPUT, SWETask
from .testparse import parse_tests

MISSING = "missing"  # a listed test that the run did not report at all
PASS_STATUSES = ("PASSED", "XFAIL")
FAIL_STATUSES = ("FAILED", "ERROR")
# Written into the log when the run failed in a way SWE-bench's grader must not score
# (swebench's get_logs_eval then returns "no results").
TESTS_TIMEOUT = ">>>>> Tests Timed Out"

StatusParser = Callable[[str], dict[str, str]]


class ParserError(ValueError):
    """The recipe names a log parser that does not exist."""


class TestReport(BaseModel):
    resolved: bool
    resolution: str = "RESOLVED_NO"  # swebench's ResolvedStatus value
    fail_to_pass: dict[str, str] = Field(default_factory=dict)  # listed id -> outcome | "missing"
    pass_to_pass: dict[str, str] = Field(default_factory=dict)
    failing: list[str] = Field(default_factory=list)  # listed ids that failed, F2P first
    tests_status: dict[str, dict[str, list[str]]] = Field(default_factory=dict)  # swebench's report shape
    outcomes: dict[str, str] = Field(default_factory=dict)  # every status the log gave
    exit_code: int | None = None
    parser: str = ""
    graded_by: str = ""  # "swebench X.Y" or "sandgym"


def output_section(log: str) -> str:
    """The part of the log between SWE-bench's markers (the whole log without them)."""
    if START_TEST_OUTPUT in log and END_TEST_OUTPUT in log:
        return log.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
    return log


def _swebench_test_spec(task: SWETask) -> Any:
    try:
        from swebench.harness.test_spec.test_spec import TestSpec
    except ImportError:
        return None
    return TestSpec(instance_id=task.instance_id, repo=task.repo, version=task.version, repo_script_list=[],
                    eval_script_list=[], env_script_list=[], arch="x86_64", FAIL_TO_PASS=task.FAIL_TO_PASS,
                    PASS_TO_PASS=task.PASS_TO_PASS, language="py", docker_specs={}, namespace=None)


@lru_cache(maxsize=1)
def _swebench_parsers() -> dict[str, Callable[..., dict[str, str]]]:
    try:
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    except ImportError:
        return {}
    return dict(MAP_REPO_TO_PARSER)


def _wrap(fn: Callable[..., dict[str, str]], task: SWETask) -> StatusParser:
    params = inspect.signature(fn).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_spec = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
    spec = _swebench_test_spec(task) if takes_spec else None
    return (lambda log: dict(fn(log, spec))) if takes_spec else (lambda log: dict(fn(log)))


def _sandgym(framework: str) -> StatusParser:
    def parse(log: str) -> dict[str, str]:
        return {tid: o.status for tid, o in parse_tests(log, framework).items()}

    return parse


def parser_for(task: SWETask) -> tuple[str, StatusParser]:
    """(name, parser) for the task's recipe."""
    recipe = task.require_recipe()
    name = recipe.log_parser
    swe = _swebench_parsers()
    if name is None:
        if task.repo in swe:
            return f"swebench:{task.repo}", _wrap(swe[task.repo], task)
        fw = recipe.framework()
        return f"sandgym-{fw}", _sandgym(fw)
    if name in ("swebench",) or name.startswith("swebench:"):
        repo = task.repo if name == "swebench" else name.split(":", 1)[1]
        if not swe:
            raise ParserError(f"log parser {name!r} needs the swebench package (pip install 'sandgym[swe]')")
        if repo not in swe:
            raise ParserError(f"swebench has no log parser for {repo!r}; name one (e.g. swebench-pytest) or use module:function")
        return f"swebench:{repo}", _wrap(swe[repo], task)
    if name.startswith("swebench-"):
        try:
            mod = importlib.import_module("swebench.harness.log_parsers.python")
        except ImportError as exc:
            raise ParserError(f"log parser {name!r} needs the swebench package (pip install 'sandgym[swe]')") from exc
        fn = getattr(mod, "parse_log_" + name.removeprefix("swebench-").replace("-", "_"), None)
        if fn is None:
            raise ParserError(f"swebench has no parser parse_log_{name.removeprefix('swebench-')}")
        return name, _wrap(fn, task)
    if name in ("sandgym-pytest", "sandgym-unittest", "pytest", "unittest"):
        fw = name.removeprefix("sandgym-")
        return f"sandgym-{fw}", _sandgym(fw)
    if ":" in name:
        mod_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ParserError(f"cannot load log parser {name!r}: {exc}") from exc
        return name, _wrap(fn, task)
    raise ParserError(f"unknown log parser {name!r}; use swebench, swebench:<owner/name>, swebench-<name>, "
                      f"sandgym-pytest, sandgym-unittest or module:function")


def status_map(task: SWETask, log: str) -> tuple[str, dict[str, str]]:
    """(parser name, {test id: status}) the way swebench's get_logs_eval reads a log."""
    name, parse = parser_for(task)
    found = parse(output_section(log))
    if not found:
        found = parse(log)
    return name, found


def _report_swebench(smap: dict[str, str], f2p: list[str], p2p: list[str]) -> tuple[dict[str, Any], str] | None:
    try:
        from swebench.harness.constants import EvalType
        from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    except ImportError:
        return None
    report = get_eval_tests_report(smap, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}, eval_type=EvalType.PASS_AND_FAIL)
    return report, get_resolution_status(report)


def _report_sandgym(smap: dict[str, str], f2p: list[str], p2p: list[str]) -> tuple[dict[str, Any], str]:
    def split(ids: list[str]) -> dict[str, list[str]]:
        ok = [t for t in ids if smap.get(t) in PASS_STATUSES]
        bad = [t for t in ids if t not in smap or smap[t] in FAIL_STATUSES]
        return {"success": ok, "failure": bad}

    report: dict[str, dict[str, list[str]]] = {"FAIL_TO_PASS": split(f2p), "PASS_TO_PASS": split(p2p),
              "FAIL_TO_FAIL": {"success": [], "failure": []}, "PASS_TO_FAIL": {"success": [], "failure": []}}

    def rate(k: str) -> float:
        n = len(report[k]["success"]) + len(report[k]["failure"])
        return 1.0 if n == 0 else len(report[k]["success"]) / n

    f, p = rate("FAIL_TO_PASS"), rate("PASS_TO_PASS")
    res = "RESOLVED_FULL" if f == 1 and p == 1 else "RESOLVED_PARTIAL" if 0 < f < 1 and p == 1 else "RESOLVED_NO"
    return report, res


def grade(task: SWETask, smap: dict[str, str], *, parser: str = "") -> TestReport:
    f2p, p2p = list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS)
    got = _report_swebench(smap, f2p, p2p)
    if got is not None:
        from .specs import swebench_version

        report, resolution = got
        by = f"swebench {swebench_version()}"
    else:
        report, resolution = _report_sandgym(smap, f2p, p2p)
        by = "sandgym"

    def outcome(t: str) -> str:
        return smap[t].lower() if t in smap else MISSING

    failing = report["FAIL_TO_PASS"]["failure"] + report["PASS_TO_PASS"]["failure"]
    return TestReport(
        resolved=resolution == "RESOLVED_FULL", resolution=resolution,
        fail_to_pass={t: outcome(t) for t in f2p}, pass_to_pass={t: outcome(t) for t in p2p},
        failing=list(failing), tests_status={k: {"success": list(v["success"]), "failure": list(v["failure"])}
                                             for k, v in report.items()},
        outcomes={k: v.lower() for k, v in smap.items()}, parser=parser, graded_by=by,
    )


def grade_log(task: SWETask, log: str) -> TestReport:
    """The report for a test log (markers, parser and grader as above)."""
    name, smap = status_map(task, log)
    return grade(task, smap, parser=name)
