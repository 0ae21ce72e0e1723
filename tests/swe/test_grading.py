"""Grading agrees with SWE-bench's grader on recorded test logs.

The logs in data/grading/ are test output from real `sandgym swe debug` runs here (genuine
SWE-bench rows of astroid, sympy, sqlfluff, marshmallow and pydicom; traceback bodies
removed: they quote the repositories' tests and no parser reads them) plus synthetic logs
in pytest, Django and sympy `bin/test` formats whose test ids hold spaces, brackets and
rich-markup text (`[red]`, `[/n/fs/x]`). For each, sandgym's report (marker extraction,
parser choice, FAIL_TO_PASS / PASS_TO_PASS lists) must equal the report swebench's own
`get_eval_report` writes for the same log file, and the grader sandgym falls back on
without the package must agree with swebench's on the same statuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandgym.swe.grading import _report_sandgym, _report_swebench, grade_log, output_section, status_map
from sandgym.swe.tasks import SWETask
from tests.conftest import require

DATA = Path(__file__).parent / "data" / "grading"
CASES: list[dict[str, Any]] = json.loads((DATA / "cases.json").read_text())

require("swebench")


def _task(case: dict[str, Any]) -> SWETask:
    return SWETask.model_validate({
        "instance_id": case["instance_id"], "repo": case["repo"], "version": case["version"], "base_commit": "0" * 40,
        # As SWE-bench rows store them: JSON strings.
        "FAIL_TO_PASS": json.dumps(case["FAIL_TO_PASS"]), "PASS_TO_PASS": json.dumps(case["PASS_TO_PASS"]),
        "recipe": {"log_parser": "swebench"},
    })


def _swebench_report(task: SWETask, log_path: Path) -> dict[str, Any]:
    from swebench.harness.grading import get_eval_report

    from sandgym.swe.grading import _swebench_test_spec

    pred = {"instance_id": task.instance_id, "model_name_or_path": "sandgym", "model_patch": "diff"}
    return get_eval_report(_swebench_test_spec(task), pred, str(log_path), include_tests_status=True)[task.instance_id]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['instance_id']}:{c['log']}" for c in CASES])
def test_report_is_swebenchs(case: dict[str, Any]) -> None:
    task = _task(case)
    log_path = DATA / case["log"]
    ours = grade_log(task, log_path.read_text())
    theirs = _swebench_report(task, log_path)
    assert theirs["patch_successfully_applied"], "swebench must find the markers in the log"
    assert ours.tests_status == theirs["tests_status"]
    assert ours.resolved is theirs["resolved"] is case["resolved"]
    assert ours.parser == f"swebench:{task.repo}" and ours.graded_by.startswith("swebench ")
    if "failing" in case:
        assert ours.failing == case["failing"]
    # Every listed id has an outcome or is "missing"; failing ids are exactly swebench's failures.
    assert set(ours.fail_to_pass) == set(case["FAIL_TO_PASS"]) and set(ours.pass_to_pass) == set(case["PASS_TO_PASS"])
    failures = theirs["tests_status"]["FAIL_TO_PASS"]["failure"] + theirs["tests_status"]["PASS_TO_PASS"]["failure"]
    assert ours.failing == failures


@pytest.mark.parametrize("case", CASES, ids=[f"{c['instance_id']}:{c['log']}" for c in CASES])
def test_fallback_grader_agrees(case: dict[str, Any]) -> None:
    task = _task(case)
    _, smap = status_map(task, (DATA / case["log"]).read_text())
    theirs = _report_swebench(smap, task.FAIL_TO_PASS, task.PASS_TO_PASS)
    assert theirs is not None
    assert _report_sandgym(smap, task.FAIL_TO_PASS, task.PASS_TO_PASS) == theirs


def test_ids_as_swebench_cuts_them() -> None:
    """pytest ids with spaces: SWE-bench keeps the first token (`test_fix_stdin[select`),
    so a dataset lists that; markup-like ids come through as text."""
    case = next(c for c in CASES if c["instance_id"] == "synthetic__pytest-markup")
    rep = grade_log(_task(case), (DATA / case["log"]).read_text())
    m = "tests/test_m.py::"
    assert rep.fail_to_pass == {m + "test_path[/n/fs/x]": "passed", m + "test_fix_stdin[select": "passed", m + "test_param[a": "failed"}
    assert rep.pass_to_pass[m + "test_markup[[bold]x[/bold]]"] == "passed"
    assert rep.pass_to_pass[m + "test_err[x"] == "error" and rep.pass_to_pass[m + "test_xf"] == "xfail"
    assert rep.pass_to_pass[m + "test_missing_one"] == "missing"
    django = next(c for c in CASES if c["instance_id"] == "synthetic__django-resolved")
    rep = grade_log(_task(django), (DATA / django["log"]).read_text())
    assert rep.fail_to_pass == {"Check [red] and [/n/fs/x] paths in the message.": "passed"}
    assert rep.pass_to_pass["test_markup_skip (auth_tests.test_validators.MarkupTests)"] == "skipped"


def test_markers_and_timeouts() -> None:
    log = "noise PASSED x::y\n>>>>> Start Test Output\nPASSED a::b\n>>>>> End Test Output\nPASSED c::d\n"
    assert output_section(log) == "\nPASSED a::b\n"
    task = SWETask.model_validate({"instance_id": "i", "repo": "pylint-dev/astroid", "version": "2.9", "base_commit": "0" * 40,
                                   "FAIL_TO_PASS": ["a::b"], "recipe": {"log_parser": "swebench"}})
    assert grade_log(task, log).outcomes == {"a::b": "passed"}
    assert grade_log(task, "PASSED a::b\n").resolved  # no markers: the whole log


def test_parser_choice() -> None:
    from sandgym.swe.grading import ParserError, parser_for

    def t(repo: str, parser: str | None) -> SWETask:
        return SWETask.model_validate({"instance_id": "i", "repo": repo, "base_commit": "0" * 40,
                                       "recipe": {"log_parser": parser} if parser else {}})

    assert parser_for(t("sympy/sympy", None))[0] == "swebench:sympy/sympy"  # a SWE-bench repo: its parser
    assert parser_for(t("local/x", None))[0] == "sandgym-pytest"
    assert parser_for(t("getmoto/moto", "swebench-pytest"))[0] == "swebench-pytest"
    assert parser_for(t("getmoto/moto", "swebench:pytest-dev/pytest"))[0] == "swebench:pytest-dev/pytest"
    name, parse = parser_for(t("local/x", "json:loads"))  # module:function, the log text in, statuses out
    assert name == "json:loads" and parse('{"a": "PASSED"}') == {"a": "PASSED"}
    with pytest.raises(ParserError, match="unknown log parser"):
        parser_for(t("local/x", "nope"))
    with pytest.raises(ParserError, match="no log parser for 'getmoto/moto'"):
        parser_for(t("getmoto/moto", "swebench"))
