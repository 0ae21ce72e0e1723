"""The resolved check, shared by the debug run and the agentic environment.

In a task sandbox whose /testbed holds the repository (maybe changed by a debug step or an
agent): record the diff against base_commit, put the test files back to base_commit (so a
change to the tests cannot pass them), apply `test_patch`, run the eval script (the
recipe's eval commands, then the test command between SWE-bench's output markers), and
grade the log as SWE-bench does (sandgym.swe.grading): resolved = every FAIL_TO_PASS and
every PASS_TO_PASS test passes.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

from pydantic import BaseModel, Field

from sandgym.sandboxes.result import ExecResult

from .grading import MISSING, TESTS_TIMEOUT, ParserError, TestReport, grade_log
from .images import BUILT_LAYOUT, ImageLayout
from .patches import cut_short
from .tasks import END_TEST_OUTPUT, START_TEST_OUTPUT, TESTBED, SWETask, diff_paths

__all__ = ["MISSING", "SCRATCH", "Evaluation", "PatchApply", "TestReport", "apply_patch", "evaluate", "prepare", "run_logged"]

SCRATCH = "/tmp/sandgym-swe"


class PatchApply(BaseModel):
    """How a patch went onto /testbed. `method`: "git" (`git apply`, exact), "patch" (the
    fallback SWE-bench also takes, `patch --fuzz=5`: context may have drifted, so the hunks
    it moved or fuzzed are listed in `fuzzy`), or None: it did not apply, and nothing of it
    was (the fallback is tried dry first). `error` says why, in git's words and patch's."""

    ok: bool
    method: str | None = None
    fuzzy: list[str] = Field(default_factory=list)  # patch's notes: "Hunk #1 succeeded at 14 with fuzz 2."
    git_error: str | None = None  # what git apply said when it refused (the fallback's reason)
    error: str | None = None
    exit_code: int | None = None

    def note(self, what: str) -> str | None:
        """One line for a fuzzy apply (None for an exact one)."""
        if self.method != "patch":
            return None
        moved = "; ".join(self.fuzzy) or "no hunk moved"
        return f"{what} applied by patch --fuzz=5 after git apply refused it ({_git_says(self.git_error)}): {moved}"


_CORRUPT = ("corrupt patch", "malformed patch", "patch fragment without header", "No valid patches in input",
            "unexpected end of file in patch", "only garbage was found")
_HUNK_NOTE = re.compile(r"^Hunk #\d+ succeeded at \d+.*$", re.MULTILINE)


class Evaluation(BaseModel):
    report: TestReport | None = None
    diff: str = ""
    error: str | None = None  # the test patch did not apply, the run timed out, ...
    infra: str | None = None  # set when the failure is the environment's (timeout, output cap), not the patch's
    test_patch: PatchApply | None = None  # how the test patch went on (fuzzy, say)
    logs: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


def log_text(cmd: str, r: ExecResult) -> str:
    head = f"$ {cmd}\n[exit {r.exit_code}{', timed out' if r.timed_out else ''}{', output truncated' if r.truncated else ''}; {r.duration_s:.2f}s]\n"
    body = r.stdout
    if r.stderr:
        body += ("\n" if body and not body.endswith("\n") else "") + "[stderr]\n" + r.stderr
    return head + body


async def run_logged(sb: Any, cmd: str, logs: dict[str, str], key: str, *, timeout: float, cwd: str = TESTBED) -> ExecResult:
    r = await sb.exec(cmd, timeout=timeout, cwd=cwd)
    logs[key] = (logs.get(key, "") + ("\n" if key in logs else "") + log_text(cmd, r))
    return r


async def prepare(sb: Any, task: SWETask, logs: dict[str, str], layout: ImageLayout = BUILT_LAYOUT) -> str:
    """Ready /testbed as the image's layout says (built images: fill the fresh /testbed from
    the pristine copy; prebuilt: the image's own); check it is at base_commit. Returns the full commit id, which later diffs and test-file restores are taken against
    (HEAD may move: an agent can commit). A task with a setup patch (SWE-smith) starts at
    the commit that holds it, on top of base_commit."""
    r = await run_logged(sb, layout.setup, logs, "setup", timeout=300, cwd="/")
    if not r.ok:
        raise RuntimeError(f"setup failed (exit {r.exit_code}): {(r.stderr or r.stdout)[-500:]}")
    head = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if not re.fullmatch(r"[0-9a-f]{40,64}", head):
        raise RuntimeError(f"setup did not report the commit of /testbed: {r.stdout[-200:]!r}")
    if not task.setup_patch and re.fullmatch(r"[0-9a-f]{4,64}", task.base_commit) and not head.startswith(task.base_commit):
        raise RuntimeError(f"/testbed is at {head}, expected base_commit {task.base_commit}")
    return head


_GIT_NOISE = ("error: while searching for:",)
_PATCH_SAYS = ("FAILED", "malformed", "can't find file", "garbage", "Reversed (or previously applied)", "No file to patch", "****")


def _git_says(text: str | None) -> str:
    """git apply's reason in a line: its `error:` lines (not the context dump)."""
    lines = [x.strip() for x in (text or "").splitlines()]
    errors = [x for x in lines if x.startswith("error:") and not x.startswith(_GIT_NOISE)]
    return "; ".join(dict.fromkeys(errors[:3])) or next((x for x in reversed(lines) if x), "(no message)")


def _patch_says(text: str) -> str:
    """patch's reason in a line: the hunks it failed, or its last word."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    found = [x for x in lines if any(k in x for k in _PATCH_SAYS)]
    return "; ".join(found[:3]) or (lines[-1] if lines else "(no message)")


async def apply_patch(sb: Any, patch: str, name: str, logs: dict[str, str], key: str, *, reverse: bool = False) -> PatchApply:
    """`git apply`; when git refuses a well-formed patch, `patch --fuzz=5 -p1` as SWE-bench's
    harness does, first with --dry-run so that a patch that does not apply leaves the tree
    as it was. A corrupt patch (one cut short, say) is never given to the fallback, which
    would apply its first hunks and fuzz the torn one. The steps are logged under `key`."""
    path = f"{SCRATCH}/{name}.diff"
    await sb.write_file(path, patch if patch.endswith("\n") else patch + "\n")
    rev = " --reverse" if reverse else ""
    r = await run_logged(sb, f"git apply --verbose --whitespace=nowarn{rev} {path}", logs, key, timeout=120)
    if r.ok:
        return PatchApply(ok=True, method="git", exit_code=r.exit_code)
    said = (r.stderr + "\n" + r.stdout).strip()
    torn = cut_short(patch)
    if torn or any(c in said for c in _CORRUPT):
        why = "; ".join(torn) if torn else _git_says(said)
        return PatchApply(ok=False, git_error=said[-2000:], exit_code=r.exit_code,
                          error=f"the patch is corrupt (cut short?): {why}; git apply: {_git_says(said)}; nothing was applied")
    fuzz = f"patch --batch --fuzz=5 --forward{rev} -p1 --no-backup-if-mismatch --reject-file=- -i {path}"
    dry = await run_logged(sb, f"{fuzz} --dry-run", logs, key, timeout=120)
    if not dry.ok:
        return PatchApply(ok=False, git_error=said[-2000:], exit_code=r.exit_code,
                          error=f"git apply: {_git_says(said)}; patch --fuzz=5: {_patch_says(dry.stdout + dry.stderr)}; nothing was applied")
    real = await run_logged(sb, fuzz, logs, key, timeout=120)
    out = real.stdout + real.stderr
    if not real.ok:  # the dry run passed: cannot happen unless the tree changed meanwhile
        return PatchApply(ok=False, git_error=said[-2000:], exit_code=real.exit_code,
                          error=f"patch --fuzz=5 applied part of the patch and then failed (exit {real.exit_code}): {_patch_says(out)}; "
                                "see applied.diff for what it changed")
    return PatchApply(ok=True, method="patch", fuzzy=_HUNK_NOTE.findall(out), git_error=said[-2000:], exit_code=real.exit_code)


async def current_diff(sb: Any, base: str, logs: dict[str, str]) -> str:
    """The working tree against base_commit, new files included, without touching the index."""
    idx = f"{SCRATCH}/index"
    cmd = (f"mkdir -p {SCRATCH} && cp .git/index {idx} && GIT_INDEX_FILE={idx} git add -A . "
           f"&& GIT_INDEX_FILE={idx} git diff --cached --binary {shlex.quote(base)}; rm -f {idx}")
    r = await sb.exec(cmd, timeout=120, cwd=TESTBED)
    if not r.ok:
        logs["diff"] = log_text(cmd, r)
    return r.stdout


def eval_script(task: SWETask, layout: ImageLayout = BUILT_LAYOUT) -> str:
    """The script whose output is the test log: the layout's activation (a prebuilt image's
    conda env), eval commands, then the test command between SWE-bench's markers; its exit
    status is the test command's."""
    recipe = task.require_recipe()
    lines = ["set -uo pipefail", f"cd {TESTBED}", *layout.activate, *recipe.eval_commands,
             f"echo {shlex.quote(START_TEST_OUTPUT)}", task.test_command(), "rc=$?",
             f"echo {shlex.quote(END_TEST_OUTPUT)}", "exit $rc"]
    return "\n".join(lines) + "\n"


async def evaluate(sb: Any, task: SWETask, logs: dict[str, str] | None = None, *, base: str | None = None,
                   layout: ImageLayout = BUILT_LAYOUT) -> Evaluation:
    """`base`: the commit `prepare` returned (default: the task's base_commit); `layout`: the
    image's (prebuilt images activate their conda env before the tests)."""
    logs = logs if logs is not None else {}
    ev = Evaluation(logs=logs)
    t0 = time.perf_counter()
    recipe = task.require_recipe()
    base_rev = base or task.base_commit
    ev.diff = await current_diff(sb, base_rev, logs)
    files = diff_paths(task.test_patch)
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
        applied = ev.test_patch = await apply_patch(sb, task.test_patch, "test_patch", logs, "test_patch")
        if not applied.ok:
            ev.error = f"the test patch does not apply: {applied.error}"
            return ev
    ev.timings["prepare_tests_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    script = f"{SCRATCH}/eval.sh"
    await sb.write_file(script, eval_script(task, layout))
    # One stream, in order (unittest reports on stderr).
    r = await sb.exec(f"bash {script} 2>&1", timeout=recipe.test_timeout_s, cwd=TESTBED)
    ev.timings["tests_s"] = time.perf_counter() - t1
    log = log_text(task.test_command(), r)
    if r.timed_out:
        log += f"\n{TESTS_TIMEOUT}\n"
    logs["tests"] = log
    try:
        report = grade_log(task, log)
    except ParserError as exc:
        ev.error = str(exc)
        return ev
    report.exit_code = r.exit_code
    ev.report = report
    listed = task.FAIL_TO_PASS + task.PASS_TO_PASS
    if r.timed_out:
        ev.error = f"the test command timed out after {recipe.test_timeout_s:g}s"
        ev.infra = "timeout"
    elif r.truncated and listed and not all(t in report.outcomes for t in listed):
        ev.error = f"the test output passed the sandbox's output cap ({r.output_limit} bytes); some outcomes are missing"
        ev.infra = "output_cap"
    elif not report.outcomes:
        ev.error = f"no test outcomes could be parsed from the test run (exit {r.exit_code}, parser {report.parser}); see the tests log"
    return ev
