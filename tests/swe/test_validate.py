"""Validation verdicts from an instance's runs (the runs themselves are tested through
the CLI in test_cli.py): flaky tests, FAIL_TO_PASS passing without the fix, seconds."""

from __future__ import annotations

from typing import Any

from sandgym.swe.tasks import SWETask
from sandgym.swe.validate import judge

TASK = SWETask(instance_id="o__r-1", repo="o/r", version="1.0", base_commit="0" * 40, recipe={},
               FAIL_TO_PASS=["t::f"], PASS_TO_PASS=["t::p", "t::q"])


def _run(resolved: bool, tests: dict[str, str], built: bool = False, total_s: float = 10.0, status: str | None = None) -> dict[str, Any]:
    return {"status": status or ("resolved" if resolved else "unresolved"), "resolved": resolved, "tests": tests,
            "fail_to_pass": {"t::f": tests.get("t::f", "missing")},
            "pass_to_pass": {t: tests.get(t, "missing") for t in ("t::p", "t::q")},
            "failing_tests": [t for t in ("t::f", "t::p", "t::q") if tests.get(t) not in ("passed", "xfail")],
            "image_reused": not built, "python": "3.9", "timings": {"total_s": total_s, "sandbox_s": 0.5}}


GOOD = {"t::f": "passed", "t::p": "passed", "t::q": "passed", "t::other": "passed"}
EMPTY = {"t::f": "failed", "t::p": "passed", "t::q": "passed", "t::other": "passed"}


def test_a_sound_task_is_valid_with_its_seconds() -> None:
    v = judge(TASK, {"gold_patch": [_run(True, GOOD, built=True, total_s=100), _run(True, GOOD, total_s=12)],
                     "none": [_run(False, EMPTY, total_s=8), _run(False, EMPTY, total_s=10)]})
    assert v.verdict == "valid" and v.problems == [] and v.runs == 2 and v.python == "3.9"
    assert (v.cold_s, v.gold_warm_s, v.empty_warm_s) == (100, 12, 9)


def test_problems_are_named() -> None:
    flaky_gold = [_run(True, GOOD), _run(False, {**GOOD, "t::q": "failed"})]
    leaky_empty = [_run(False, {**EMPTY, "t::f": "passed", "t::p": "failed", "t::other": "failed"}),
                   _run(False, EMPTY)]
    v = judge(TASK, {"gold_patch": flaky_gold, "none": leaky_empty})
    assert v.verdict == "invalid"
    assert v.flaky_listed == ["t::f", "t::p", "t::q"] and v.flaky_other == 1
    assert v.gold_resolved == 1 and v.gold_failing == ["t::q"]
    assert v.f2p_passing_without_fix == ["t::f"] and v.p2p_failing_without_fix == ["t::p"]
    text = "; ".join(v.problems)
    for part in ("gold resolved 1/2 runs (failing: t::q)", "1 FAIL_TO_PASS test(s) pass without the fix",
                 "1 PASS_TO_PASS test(s) fail without the fix", "3 listed test(s) changed outcome between runs"):
        assert part in text


def test_infra_runs_are_not_counted_as_flaky() -> None:
    v = judge(TASK, {"gold_patch": [_run(True, GOOD), _run(False, {}, status="infra")], "none": [_run(False, EMPTY)]})
    assert v.infra == 1 and v.flaky_listed == [] and "1 run(s) failed for infrastructure reasons" in v.problems


def test_network_only_problems_are_needs_network() -> None:
    """Gold's only failing test reached out (infra/network); without the fix that test fails
    the same way: the task is not faulted, and the test is named."""
    net = {"network_tests": {"t::q": "OSError: [Errno 101] Network is unreachable"}}
    gold = {**_run(False, {**GOOD, "t::q": "failed"}, status="infra"), "infra_reason": "network", **net}
    empty = {**_run(False, {**EMPTY, "t::q": "failed"}), **net}
    v = judge(TASK, {"gold_patch": [gold, gold], "none": [empty, empty]})
    assert v.verdict == "needs_network" and v.network == 2 and v.infra == 0 and v.network_tests == ["t::q"]
    assert v.p2p_failing_without_fix == [] and "need the network" in v.problems[0] and "t::q" in v.problems[0]
    # A real failure beside it is still a problem of the task.
    v = judge(TASK, {"gold_patch": [gold, _run(False, {**GOOD, "t::p": "failed"})], "none": [empty, empty]})
    assert v.verdict == "invalid"


def test_runs_that_never_got_a_sandbox_are_not_run() -> None:
    """No recipe this machine can build: nothing is known of the task (`not_run`, with why)."""
    err = {"status": "error", "resolved": False, "error": "o__r-1: the swebench spec for o/r 1.0 is a conda environment.yml",
           "timings": {"total_s": 0.01}}
    v = judge(TASK, {"gold_patch": [err, err], "none": [err, err]})
    assert v.verdict == "not_run" and v.problems == [f"no run got as far as a sandbox: {err['error']}"]
    # A gold patch that does not apply got a sandbox: that is the task's problem.
    no_apply = {**err, "error": "the gold patch does not apply", "timings": {"total_s": 3.0, "sandbox_s": 0.4}}
    assert judge(TASK, {"gold_patch": [no_apply], "none": [_run(False, EMPTY)]}).verdict == "invalid"
