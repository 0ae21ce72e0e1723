"""Test runner output -> per-test outcomes (sandgym's own parsers; grading.py picks
swebench's per-repo parsers first for SWE-bench repositories).

pytest: the short summary lines of `-rA` (`PASSED tests/x.py::t`, `FAILED tests/x.py::t - msg`)
and verbose lines (`tests/x.py::t PASSED [ 50%]`); the summary wins where both appear.
unittest: verbose lines (`test_x (pkg.mod.Case.test_x) ... ok`, the pre-3.11 form
`test_x (pkg.mod.Case) ... ok`, results on a later line when the test printed), and the
`FAIL:` / `ERROR:` section headers as a backstop. unittest ids are `pkg.mod.Case.test_x`.
"""

from __future__ import annotations

import re
from enum import Enum


class Outcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAIL = "xfail"
    XPASS = "xpass"

    @property
    def ok(self) -> bool:
        """Counts as passing for resolution (SWE-bench counts an expected failure as a pass)."""
        return self in (Outcome.PASSED, Outcome.XFAIL)

    @property
    def status(self) -> str:
        """The SWE-bench TestStatus spelling (XPASS has none there: neither pass nor fail)."""
        return self.value.upper()


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PYTEST_WORDS = {
    "PASSED": Outcome.PASSED, "FAILED": Outcome.FAILED, "ERROR": Outcome.ERROR,
    "SKIPPED": Outcome.SKIPPED, "XFAIL": Outcome.XFAIL, "XPASS": Outcome.XPASS,
}
_PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)(?:\s+-\s.*)?$")
_PYTEST_VERBOSE = re.compile(r"^(\S+::\S.*?)\s+(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)(?:\s+\(.*\))?(?:\s+\[\s*\d+%\])?$")

_UT_STATUS = r"(ok|FAIL|ERROR|skipped(?: .*)?|expected failure|unexpected success)"
_UT_LINE = re.compile(r"^(\w+) \(([\w.]+)\)(?:\s*\n?.*?)? \.\.\. " + _UT_STATUS + r"$")
_UT_START = re.compile(r"^(\w+) \(([\w.]+)\)")
_UT_STATUS_ONLY = re.compile(r"^(?:.* )?" + _UT_STATUS + r"$")
_UT_HEADER = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)")
_UT_WORDS = {
    "ok": Outcome.PASSED, "FAIL": Outcome.FAILED, "ERROR": Outcome.ERROR,
    "expected failure": Outcome.XFAIL, "unexpected success": Outcome.XPASS,
}


def _clean(text: str) -> list[str]:
    return [_ANSI.sub("", line).rstrip("\r") for line in text.splitlines()]


def parse_pytest(text: str) -> dict[str, Outcome]:
    verbose: dict[str, Outcome] = {}
    summary: dict[str, Outcome] = {}
    for line in _clean(text):
        s = line.strip()
        m = _PYTEST_SUMMARY.match(s)
        if m and "::" in m.group(2) or (m and m.group(1) == "ERROR" and m.group(2).endswith(".py")):
            summary[m.group(2)] = _PYTEST_WORDS[m.group(1)]
            continue
        m = _PYTEST_VERBOSE.match(s)
        if m:
            verbose[m.group(1)] = _PYTEST_WORDS[m.group(2)]
    return {**verbose, **summary}


def _ut_id(name: str, inner: str) -> str:
    # 3.11+: "(mod.Case.test_x)"; older: "(mod.Case)".
    return inner if inner.endswith("." + name) else f"{inner}.{name}"


def _ut_outcome(word: str) -> Outcome:
    if word.startswith("skipped"):
        return Outcome.SKIPPED
    return _UT_WORDS[word]


def parse_unittest(text: str) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    pending: str | None = None  # a test whose status line has not come yet
    lines = _clean(text)
    for line in lines:
        m = _UT_LINE.match(line)
        if m:
            out[_ut_id(m.group(1), m.group(2))] = _ut_outcome(m.group(3))
            pending = None
            continue
        m = _UT_START.match(line)
        if m and not _UT_HEADER.match(line):
            pending = _ut_id(m.group(1), m.group(2))
            continue
        if pending:
            m = _UT_STATUS_ONLY.match(line.strip())
            if m and (" ... " in line or line.strip() == m.group(1)):
                out[pending] = _ut_outcome(m.group(1))
                pending = None
    for line in lines:
        m = _UT_HEADER.match(line)
        if m:
            tid = _ut_id(m.group(2), m.group(3))
            if out.get(tid) not in (Outcome.FAILED, Outcome.ERROR):
                out[tid] = Outcome.FAILED if m.group(1) == "FAIL" else Outcome.ERROR
    return out


def detect_framework(text: str) -> str:
    if re.search(r"^=+ test session starts =+$", text, re.M) or re.search(r"^=+ short test summary info =+$", text, re.M):
        return "pytest"
    if re.search(r"^Ran \d+ tests? in ", text, re.M):
        return "unittest"
    return "pytest"


def parse_tests(text: str, framework: str = "auto") -> dict[str, Outcome]:
    """Per-test outcomes from a test run's combined stdout+stderr."""
    if framework == "auto":
        framework = detect_framework(text)
    if framework == "unittest":
        return parse_unittest(text)
    if framework == "pytest":
        return parse_pytest(text)
    raise ValueError(f"unknown test framework {framework!r}; choose pytest, unittest or auto")
