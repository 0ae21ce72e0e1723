"""Which failing tests failed only because the sandbox has no network.

SWE-bench runs its tests in containers with a network; sandboxes here have none unless a
row asks for it (`network: true`) and the operator allows hosts (`--network-allow`). Dataset
rows say nothing about network, so a test that reaches out (requests' `test_connect_timeout`
connects to 10.255.255.1 and expects a timeout) fails here for a reason that is not the
patch's.

How a test is known to need the network: its own part of the test log (its failure section
or its line in the short summary) shows an error that only a missing network gives: the
kernel's ENETUNREACH ("Network is unreachable", errno 101) or EHOSTUNREACH from a sandbox
with no route out, or a failed DNS lookup (EAI_AGAIN "Temporary failure in name
resolution", EAI_NONAME "Name or service not known", "No address associated with
hostname", curl's "Could not resolve host"). "Connection refused" is not one of them: it
is what a test's own local server that did not start gives. A failing test whose part of
the log shows none of these is not counted; nor is a test the log does not show at all.

An instance whose failing FAIL_TO_PASS/PASS_TO_PASS tests all failed this way is an
`infra` failure with reason `network` (the tests are named), not `unresolved`; where other
tests failed too, it stays `unresolved` and the network-needing ones are named beside it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Errors only a missing network gives (see the module's doc for why each).
SIGNATURES = (
    "Network is unreachable",
    "ENETUNREACH",
    "[Errno 101]",
    "No route to host",
    "EHOSTUNREACH",
    "Temporary failure in name resolution",
    "Name or service not known",
    "No address associated with hostname",
    "[Errno -3]",
    "[Errno -2]",
    "[Errno -5]",
    "nodename nor servname provided",
    "getaddrinfo failed",
    "Could not resolve host",
    "Failed to resolve",
)

# Headers that open one test's part of a log: pytest's and sympy's `____ name ____` (not
# pytest's `_ _ _ _` between traceback entries), and
# unittest's (django's) `ERROR: test_x (module.Class)` / `FAIL: ...`.
_UNDERSCORE_HEADER = re.compile(r"^_+ ([^_ ].*?) _+\s*$")  # a long name leaves one `_` a side
_UNITTEST_HEADER = re.compile(r"^(?:ERROR|FAIL): (\S+)(?: \(([^)]*)\))?")
_SUMMARY_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$")


def signature_in(text: str) -> str | None:
    """The first line of `text` that shows a network error, stripped (None when none does)."""
    for line in text.splitlines():
        if any(sig in line for sig in SIGNATURES):
            return line.strip()[:300]
    return None


def _sections(log: str) -> list[tuple[str, str]]:
    """(header, body) for each test section of the log."""
    out: list[tuple[str, list[str]]] = []
    for line in log.splitlines():
        m = _UNDERSCORE_HEADER.match(line)
        u = _UNITTEST_HEADER.match(line) if m is None else None
        if m is not None:  # `ERROR at setup of test_x`: the test's own section too
            out.append((re.sub(r"^ERROR at (?:setup|teardown) of ", "", m.group(1).strip()), []))
        elif u is not None:
            out.append((f"{u.group(1)} ({u.group(2) or ''})", []))
        elif line.startswith("=====") and out:
            out.append(("", []))  # a rule that ends a section (pytest's summary bar, unittest's)
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(b)) for h, b in out if h]


def _names(test_id: str) -> list[str]:
    """The ways a log's section header can name a test: `Class.test_x`, `test_x`, `test_x[p]`,
    django's `test_x (module.Class)` and sympy's `path:test_x`."""
    tail = test_id.split("::")
    names = [".".join(tail[1:]), tail[-1]] if len(tail) > 1 else [test_id]
    m = re.fullmatch(r"(\S+) \(([^)]*)\)", test_id)  # django: test_x (module.Class)
    if m:
        names = [test_id, m.group(1)]
    return [n for n in dict.fromkeys(names) if n]


def network_failures(log: str, failing: Iterable[str]) -> dict[str, str]:
    """{test id: the log line that shows its network error} for the `failing` tests whose
    own part of `log` shows one (the others are left out)."""
    sections = _sections(log)
    summary: dict[str, str] = {}
    for line in log.splitlines():
        m = _SUMMARY_LINE.match(line.strip())
        if m and m.group(2):
            summary[m.group(1)] = m.group(2)
    found: dict[str, str] = {}
    for test in failing:
        hit = None
        names = _names(test)
        for header, body in sections:  # the section first: the summary line may be cut short
            if header in names or header.split(" (", 1)[0] in names or any(header.endswith(f":{n}") for n in names):
                hit = signature_in(body)
                if hit:
                    break
        hit = hit or signature_in(summary.get(test, ""))
        if hit:
            found[test] = hit
    return found
