"""How a failing test is known to need the network, on logs as pytest, Django's runner and
sympy's bin/test print them: only the test's own part of the log counts, and only errors a
missing network gives (not "Connection refused")."""

from __future__ import annotations

from sandgym.swe.network import network_failures

PYTEST = """\
=================================== FAILURES ===================================
______________________ TestTimeout.test_connect_timeout _______________________

    def test_connect_timeout(self):
>       requests.get(TARPIT, timeout=(0.1, None))
E       OSError: [Errno 101] Network is unreachable
____ RequestsTestSuite.test_accept_objects_with_string_representations_as_urls ___
E       requests.exceptions.ConnectionError: [Errno -3] Temporary failure in name resolution
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _
__________________________ test_local_server[http] ___________________________
E       ConnectionRefusedError: [Errno 111] Connection refused
______________________________ test_value ______________________________________
E       assert 1 == 2
=========================== short test summary info ============================
FAILED tests/test_requests.py::TestTimeout::test_connect_timeout - OSError: [Errno 101] Network is unre...
FAILED tests/test_requests.py::test_local_server[http] - ConnectionRefusedError: [Errno 111] Connection refused
FAILED tests/test_v.py::test_value - assert 1 == 2
FAILED tests/test_v.py::test_summary_only - socket.gaierror: [Errno -2] Name or service not known
"""

DJANGO = """\
======================================================================
ERROR: test_fetch (view_tests.tests.test_static.StaticTests)
----------------------------------------------------------------------
Traceback (most recent call last):
urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>

======================================================================
FAIL: test_format (utils_tests.test_numberformat.TestNumberFormat)
----------------------------------------------------------------------
AssertionError: '1' != '2'
----------------------------------------------------------------------
Ran 2 tests in 0.1s
"""

SYMPY = """\
________________________________________________________________________________
________ sympy/utilities/tests/test_download.py:test_fetch_remote ________
  File "/testbed/sympy/utilities/tests/test_download.py", line 5, in test_fetch_remote
OSError: [Errno 101] Network is unreachable
________________________________________________________________________________
_______ sympy/solvers/tests/test_polysys.py:test_solve_poly_system ________
AssertionError
"""


def test_pytest_sections_and_summary_lines() -> None:
    failing = ["tests/test_requests.py::TestTimeout::test_connect_timeout",
               "tests/test_requests.py::RequestsTestSuite::test_accept_objects_with_string_representations_as_urls",
               "tests/test_requests.py::test_local_server[http]", "tests/test_v.py::test_value",
               "tests/test_v.py::test_summary_only", "tests/test_v.py::test_not_in_the_log"]
    found = network_failures(PYTEST, failing)
    assert set(found) == {failing[0], failing[1], failing[4]}
    # The section's own line, whole (the summary line is cut short by pytest).
    assert found[failing[0]] == "E       OSError: [Errno 101] Network is unreachable"
    assert "Name or service not known" in found[failing[4]]


def test_django_and_sympy_logs() -> None:
    found = network_failures(DJANGO, ["test_fetch (view_tests.tests.test_static.StaticTests)",
                                      "test_format (utils_tests.test_numberformat.TestNumberFormat)"])
    assert list(found) == ["test_fetch (view_tests.tests.test_static.StaticTests)"]
    assert network_failures(SYMPY, ["test_fetch_remote", "test_solve_poly_system"]) == {
        "test_fetch_remote": "OSError: [Errno 101] Network is unreachable"}
