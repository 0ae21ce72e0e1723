"""The resolved check, shared by the debug run and the agentic environment.

In a task sandbox whose /testbed holds the repository (maybe changed by a debug step or an
agent): record the diff against base_commit, put the test files back to base_commit (so a
change to the tests cannot pass them), apply `test_patch`, run the test command, parse
per-test outcomes, and decide resolved = every FAIL_TO_PASS and every PASS_TO_PASS passes.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

from pydantic import BaseModel, Field

from sandgym.sandboxes.result import ExecResult

from .images import setup_commands
from .tasks import TESTBED, SWETask
from .testparse import Outcome, parse_tests

MISSING = "missing"  # a listed test that the run did not report at all
SCRATCH = "/tmp/sandgym-swe"


class TestReport(BaseModel):
    resolved: bool
    fail_to_pass: dict[str, str] = Field(default_factory=dict)  # listed id -> outcome | "missing"
    pass_to_pass: dict[str, str] = Field(default_factory=dict)
    failing: list[str] = Field(default_factory=list)  # listed ids that did not pass, F2P first
    outcomes: dict[str, str] = Field(default_factory=dict)  # everything the run reported
    exit_code: int | None = None
    framework: str = "pytest"


class Evaluation(BaseModel):
    report: TestReport | None = None
    diff: str = ""
    error: str | None = None  # the test patch did not apply, the run timed out, ...
    logs: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


def log_text(cmd: str, r: ExecResult) -> str:
    head = f"$ {cmd}\n[exit {r.exit_code}{', timed out' if r.timed_out else ''}{', output truncated' if r.truncated else ''}; {r.duration_s:.2f}s]\n"
    body = r.stdout
    if r.stderr:
        body += ("\n" if body and not body.endswith("\n") else "") + "[stderr]\n" + r.stderr
    return head + body


def judge(task: SWETask, outcomes: dict[str, Outcome]) -> TestReport:
    def status(tid: str) -> str:
        o = outcomes.get(tid)
        return o.value if o is not None else MISSING

    f2p = {t: status(t) for t in task.FAIL_TO_PASS}
    p2p = {t: status(t) for t in task.PASS_TO_PASS}
    ok = {Outcome.PASSED.value, Outcome.XFAIL.value}
    failing = [t for t, s in f2p.items() if s not in ok] + [t for t, s in p2p.items() if s not in ok]
    # A task that lists no tests cannot show that anything was fixed.
    resolved = not failing and bool(f2p or p2p)
    return TestReport(resolved=resolved, fail_to_pass=f2p, pass_to_pass=p2p, failing=failing,
                      outcomes={k: v.value for k, v in outcomes.items()})


async def run_logged(sb: Any, cmd: str, logs: dict[str, str], key: str, *, timeout: float, cwd: str = TESTBED) -> ExecResult:
    r = await sb.exec(cmd, timeout=timeout, cwd=cwd)
    logs[key] = (logs.get(key, "") + ("\n" if key in logs else "") + log_text(cmd, r))
    return r


async def prepare(sb: Any, task: SWETask, logs: dict[str, str]) -> str:
    """Fill the fresh /testbed from the image's pristine copy; check it is at base_commit.
    Returns the full commit id, which later diffs and test-file restores are taken against
    (HEAD may move: an agent can commit)."""
    r = await run_logged(sb, setup_commands(TESTBED), logs, "setup", timeout=300, cwd="/")
    if not r.ok:
        raise RuntimeError(f"setup failed (exit {r.exit_code}): {(r.stderr or r.stdout)[-500:]}")
    head = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if not re.fullmatch(r"[0-9a-f]{40,64}", head):
        raise RuntimeError(f"setup did not report the commit of /testbed: {r.stdout[-200:]!r}")
    if re.fullmatch(r"[0-9a-f]{4,64}", task.base_commit) and not head.startswith(task.base_commit):
        raise RuntimeError(f"/testbed is at {head}, expected base_commit {task.base_commit}")
    return head


async def apply_patch(sb: Any, patch: str, name: str, logs: dict[str, str], key: str) -> ExecResult:
    """`git apply`, falling back to `patch -p1` (fuzzier) when git refuses."""
    path = f"{SCRATCH}/{name}.diff"
    await sb.write_file(path, patch if patch.endswith("\n") else patch + "\n")
    cmd = (f"git apply --verbose --whitespace=nowarn {path} || "
           f"(echo '[git apply failed; trying patch -p1]'; patch --batch --fuzz=5 --forward -p1 --no-backup-if-mismatch --reject-file=- -i {path})")
    return await run_logged(sb, cmd, logs, key, timeout=120)


async def current_diff(sb: Any, base: str, logs: dict[str, str]) -> str:
    """The working tree against base_commit, new files included, without touching the index."""
    idx = f"{SCRATCH}/index"
    cmd = (f"mkdir -p {SCRATCH} && cp .git/index {idx} && GIT_INDEX_FILE={idx} git add -A . "
           f"&& GIT_INDEX_FILE={idx} git diff --cached --binary {shlex.quote(base)}; rm -f {idx}")
    r = await sb.exec(cmd, timeout=120, cwd=TESTBED)
    if not r.ok:
        logs["diff"] = log_text(cmd, r)
    return r.stdout


async def evaluate(sb: Any, task: SWETask, logs: dict[str, str] | None = None, *, base: str | None = None) -> Evaluation:
    """`base`: the commit `prepare` returned (default: the task's base_commit)."""
    logs = logs if logs is not None else {}
    ev = Evaluation(logs=logs)
    t0 = time.perf_counter()
    base_rev = base or task.base_commit
    ev.diff = await current_diff(sb, base_rev, logs)
    files = task.test_files
    if files:
        q = shlex.quote(base_rev)
        revert = "; ".join(
            f"if git cat-file -e {q}:{shlex.quote(f)} 2>/dev/null; then git checkout -q {q} -- {shlex.quote(f)}; else rm -f {shlex.quote(f)}; fi"
            for f in files
        )
        r = await run_logged(sb, revert, logs, "test_patch", timeout=120)
        if not r.ok:
            ev.error = f"could not restore the test files to base_commit (exit {r.exit_code})"
            return ev
    if task.test_patch.strip():
        r = await apply_patch(sb, task.test_patch, "test_patch", logs, "test_patch")
        if not r.ok:
            ev.error = f"the test patch does not apply (exit {r.exit_code}): {(r.stdout + r.stderr)[-400:]}"
            return ev
    ev.timings["prepare_tests_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    cmd = task.test_command()
    # One stream, in order (unittest reports on stderr), for the whole command line.
    r = await run_logged(sb, f"(\n{cmd}\n) 2>&1", logs, "tests", timeout=task.recipe.test_timeout_s)
    ev.timings["tests_s"] = time.perf_counter() - t1
    framework = task.recipe.framework()
    outcomes = parse_tests(r.stdout + r.stderr, framework)
    report = judge(task, outcomes)
    report.exit_code = r.exit_code
    report.framework = framework
    ev.report = report
    if r.timed_out:
        ev.error = f"the test command timed out after {task.recipe.test_timeout_s:g}s"
    elif r.truncated and task.FAIL_TO_PASS and not all(t in outcomes for t in task.FAIL_TO_PASS + task.PASS_TO_PASS):
        ev.error = f"the test output passed the sandbox's output cap ({r.output_limit} bytes); some outcomes are missing"
    elif not outcomes:
        ev.error = f"no test outcomes could be parsed from the test run (exit {r.exit_code}); see logs['tests']"
    return ev
