"""Debug runs on the real Docker engine over the bundled tasks: the gold patch resolves
every good task, `none` resolves none, the broken gold patch is reported with its failing
test, and the `command` and `script` steps run in the task sandbox."""

from __future__ import annotations

import anyio
import pytest

from sandgym.sandboxes.manager import SandboxManager
from sandgym.swe.bundled import BROKEN
from sandgym.swe.debug import InstanceResult, SWEDebugEnv, SWEDebugRunner, summary
from sandgym.swe.tasks import SWETask
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


async def _run(tasks: list[SWETask], step: str, **kw: object) -> list[InstanceResult]:
    require("docker")
    async with SandboxManager("docker", max_sandboxes=2) as mgr:
        results = await SWEDebugRunner(mgr, step=step, **kw).run(tasks, concurrency=2)  # type: ignore[arg-type]
        assert mgr.live == 0
    return results


async def test_gold_patch_resolves_good_tasks_and_reports_the_broken_one(bundled: dict[str, SWETask]) -> None:
    results = {r.instance_id: r for r in await _run(list(bundled.values()), "gold_patch")}
    for iid, r in results.items():
        assert r.status != "error", (iid, r.error, r.logs)
        assert r.resolved is (iid not in BROKEN), (iid, r.failing_tests)
        assert r.step_exit_code == 0 and r.applied_diff.startswith("diff --git")
        assert {"setup", "step", "tests"} <= set(r.logs)
    good = results["statskit__median-even"]
    assert good.fail_to_pass == {"tests/test_core.py::test_median_even": "passed"}
    assert "return (s[mid - 1] + s[mid]) / 2" in good.applied_diff
    assert results["intervals__touching"].fail_to_pass == {"tests.test_merge.TestMerge.test_touching": "passed"}
    broken = results["romanize__subtractive-broken-gold"]
    assert broken.status == "unresolved"
    assert broken.failing_tests == ["tests/test_roman.py::test_subtractive_tens"]
    assert broken.fail_to_pass["tests/test_roman.py::test_subtractive_ones"] == "passed"
    summ = summary(list(results.values()), "gold_patch")
    assert summ["resolved"] == 4 and summ["unresolved"] == 1 and summ["errors"] == 0
    assert summ["not_resolved"] == [{"instance_id": "romanize__subtractive-broken-gold", "status": "unresolved",
                                     "failing_tests": ["tests/test_roman.py::test_subtractive_tens"], "error": None, "fuzzy": []}]


async def test_step_none_resolves_nothing(bundled: dict[str, SWETask]) -> None:
    results = await _run(list(bundled.values()), "none")
    assert len(results) == 5
    for r in results:
        assert r.status == "unresolved" and not r.resolved, (r.instance_id, r.error)
        assert r.applied_diff == ""
        # Every FAIL_TO_PASS test fails; every PASS_TO_PASS test passes.
        assert set(r.failing_tests) == set(r.fail_to_pass), r.instance_id
        assert all(v == "passed" for v in r.pass_to_pass.values()), r.instance_id


async def test_command_and_script_steps(bundled: dict[str, SWETask]) -> None:
    stats = bundled["statskit__median-even"]
    assert stats.debug_command
    (r,) = await _run([stats], "command")  # the task's own debug_command fixes it
    assert r.resolved and r.step_exit_code == 0, r.logs.get("step")
    # A step that commits its change: the diff and the test-file restore still use base_commit.
    (r,) = await _run([stats], "command", command=f"{stats.debug_command} && git -c user.name=x -c user.email=x@y commit -qam fix")
    assert r.resolved and "mid" not in r.applied_diff and "n % 2" in r.applied_diff, r.logs.get("step")
    (r,) = await _run([stats], "command", command="echo nothing-done && false")
    assert not r.resolved and r.step_exit_code == 1 and "nothing-done" in r.logs["step"]
    assert r.error == "the debug command exited 1"
    script = (
        "#!/usr/bin/env python3\n"
        "import pathlib\n"
        "p = pathlib.Path('slugger/text.py')\n"
        "p.write_text(p.read_text().replace('[^a-z0-9]\", \"-\", text.lower())', '[^a-z0-9]+\", \"-\", text.lower()).strip(\"-\")'))\n"
        "print('patched', p)\n"
    )
    (r,) = await _run([bundled["slugger__collapse-runs"]], "script", script=script)
    assert r.resolved, (r.failing_tests, r.logs)
    assert "patched slugger/text.py" in r.logs["step"]


async def test_gold_patch_that_does_not_apply(bundled: dict[str, SWETask]) -> None:
    task = bundled["slugger__collapse-runs"].model_copy(update={"patch": bundled["statskit__median-even"].patch})
    (r,) = await _run([task], "gold_patch")
    # SWE-bench's behavior: an error with git's message, and no test run.
    assert not r.resolved and r.status == "error" and not r.tests and "tests" not in r.logs
    assert r.error and r.error.startswith("the gold patch does not apply: git apply: error:"), r.error


async def test_tests_cannot_be_changed_by_the_step(bundled: dict[str, SWETask]) -> None:
    """The test files are put back to base_commit before the test patch: editing them
    (here: deleting the failing test) does not make the task pass."""
    task = bundled["statskit__median-even"]
    (r,) = await _run([task], "command", command="echo 'def test_median_even(): pass' > tests/test_core.py")
    assert not r.resolved and r.fail_to_pass["tests/test_core.py::test_median_even"] == "failed"


async def test_debug_env_as_an_environment(bundled: dict[str, SWETask]) -> None:
    require("docker")
    env = SWEDebugEnv([bundled["intervals__touching"], bundled["romanize__subtractive-broken-gold"]], step="gold_patch")
    async with env.sandbox_session("docker", max_sandboxes=2):
        rows = env.rows()
        states = [None, None]

        async def one(i: int) -> None:
            states[i] = await env.rollout(None, "none", rows[i])  # type: ignore[arg-type, call-overload]

        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(one, i)
    rewards = {s.info["instance_id"]: s.reward for s in states if s is not None}
    assert rewards == {"intervals__touching": 1.0, "romanize__subtractive-broken-gold": 0.0}
    broken = next(s for s in states if s is not None and s.reward == 0.0)
    assert broken.info["swe"]["failing_tests"] == ["tests/test_roman.py::test_subtractive_tens"]
