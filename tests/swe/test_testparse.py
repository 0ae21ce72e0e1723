"""Parsers against output from real pytest and unittest runs (and the pre-3.11 unittest form)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from sandgym.swe.testparse import Outcome, detect_framework, parse_pytest, parse_tests, parse_unittest

PYTEST_FILE = textwrap.dedent('''
    import pytest

    def test_ok():
        assert True

    def test_bad():
        assert 1 == 2

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture")

    def test_error(broken):
        pass

    @pytest.mark.skip(reason="no")
    def test_skip():
        pass

    @pytest.mark.xfail
    def test_xfail():
        assert False

    @pytest.mark.xfail
    def test_xpass():
        assert True

    @pytest.mark.parametrize("n", [1, 2])
    def test_param(n):
        print("noise PASSED in output")
        assert n == 1
''')

UNITTEST_FILE = textwrap.dedent('''
    import unittest

    class TestThing(unittest.TestCase):
        def test_ok(self):
            self.assertTrue(True)

        def test_bad(self):
            self.assertEqual(1, 2)

        def test_error(self):
            raise RuntimeError("boom")

        @unittest.skip("no")
        def test_skip(self):
            pass

        @unittest.expectedFailure
        def test_xfail(self):
            self.assertEqual(1, 2)

        def test_prints(self):
            print("some output")
            self.assertTrue(True)

        def test_doc(self):
            """A docstring line."""
            self.assertTrue(True)
''')


def _run(cwd: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True)
    return proc.stdout + proc.stderr


def test_pytest_summary_and_verbose(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(PYTEST_FILE)
    expected = {
        "tests/test_a.py::test_ok": Outcome.PASSED,
        "tests/test_a.py::test_bad": Outcome.FAILED,
        "tests/test_a.py::test_error": Outcome.ERROR,
        "tests/test_a.py::test_xfail": Outcome.XFAIL,
        "tests/test_a.py::test_xpass": Outcome.XPASS,
        "tests/test_a.py::test_param[1]": Outcome.PASSED,
        "tests/test_a.py::test_param[2]": Outcome.FAILED,
    }
    for args in (["-rA"], ["-v"], ["-rA", "-v"]):
        out = _run(tmp_path, "-m", "pytest", "-p", "no:cacheprovider", *args, "tests")
        assert detect_framework(out) == "pytest"
        got = parse_tests(out)
        for tid, outcome in expected.items():
            assert got.get(tid) == outcome, (args, tid, got)
        if "-v" in args:
            assert got["tests/test_a.py::test_skip"] == Outcome.SKIPPED


def test_pytest_collection_error_is_reported(tmp_path: Path) -> None:
    (tmp_path / "test_b.py").write_text("import nonexistent_module_xyz\n\ndef test_x():\n    pass\n")
    out = _run(tmp_path, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "test_b.py")
    got = parse_pytest(out)
    assert got == {"test_b.py": Outcome.ERROR}


def test_unittest_verbose(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "test_u.py").write_text(UNITTEST_FILE)
    out = _run(tmp_path, "-m", "unittest", "-v", "pkg.test_u")
    assert detect_framework(out) == "unittest"
    got = parse_tests(out)
    p = "pkg.test_u.TestThing."
    assert got == {
        p + "test_ok": Outcome.PASSED, p + "test_bad": Outcome.FAILED, p + "test_error": Outcome.ERROR,
        p + "test_skip": Outcome.SKIPPED, p + "test_xfail": Outcome.XFAIL, p + "test_prints": Outcome.PASSED,
        p + "test_doc": Outcome.PASSED,
    }


def test_unittest_import_failure_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "test_missing.py").write_text("import nonexistent_module_xyz\n")
    out = _run(tmp_path, "-m", "unittest", "-v", "test_missing")
    got = parse_unittest(out)
    assert got and all(v is Outcome.ERROR for v in got.values())


def test_unittest_pre_311_format() -> None:
    out = textwrap.dedent('''
        test_add (tests.test_calc.TestCalc) ... ok
        test_sub (tests.test_calc.TestCalc) ... FAIL
        test_doc (tests.test_calc.TestCalc)
        Docstring here. ... ok
        test_noisy (tests.test_calc.TestCalc) ... printed stuff
        ERROR
        test_skip (tests.test_calc.TestCalc) ... skipped 'not today'

        ======================================================================
        FAIL: test_sub (tests.test_calc.TestCalc)
        ----------------------------------------------------------------------
        Ran 5 tests in 0.001s
    ''')
    got = parse_unittest(out)
    p = "tests.test_calc.TestCalc."
    assert got == {p + "test_add": Outcome.PASSED, p + "test_sub": Outcome.FAILED, p + "test_doc": Outcome.PASSED,
                   p + "test_noisy": Outcome.ERROR, p + "test_skip": Outcome.SKIPPED}


def test_failure_header_backstops_a_lost_status_line() -> None:
    out = "test_a (m.C.test_a) ... \n\n======\nFAIL: test_a (m.C.test_a)\n------\nRan 1 test in 0.0s\n"
    assert parse_unittest(out) == {"m.C.test_a": Outcome.FAILED}


def test_ansi_colours_are_ignored() -> None:
    out = "\x1b[32mPASSED\x1b[0m tests/t.py::test_a\n\x1b[31mFAILED\x1b[0m tests/t.py::test_b - assert 0\n"
    assert parse_pytest(out) == {"tests/t.py::test_a": Outcome.PASSED, "tests/t.py::test_b": Outcome.FAILED}
