"""Tests run the way SWE-bench's harness runs them, on small emulated repositories: a spec
whose test command is `tox --current-env` (sphinx's) runs its tests inside the task's venv;
tests that fail only because the sandbox has no network are told apart from real failures
(an `infra` instance with reason `network`, the tests named; `needs_network` in validation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes.manager import SandboxManager
from sandgym.swe.bundled import init_repo
from sandgym.swe.debug import InstanceResult, SWEDebugRunner
from sandgym.swe.tasks import SWETask
from tests.conftest import require

pytestmark = [pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]

SOURCE = "def value():\n    return 1\n"
TESTS = '''import socket
import sys

from pkg import value


def test_keep():
    assert True


def test_inside_a_venv():
    # tox --current-env starts .tox/<env>/bin/python: it must be the task env's Python.
    assert sys.prefix != sys.base_prefix, (sys.prefix, sys.executable)


def test_reach_out():
    # What requests' TestTimeout::test_connect_timeout does: an address no sandbox can reach.
    socket.create_connection(("10.255.255.1", 80), timeout=5).close()


def test_resolve_a_name():
    socket.getaddrinfo("pypi.org", 443)
'''
NEW_TEST = "\n\ndef test_value():\n    assert value() == 2\n"
TOX_INI = """[tox]
envlist = py311

[testenv]
skip_install = true
commands = python -m pytest -rA -p no:cacheprovider {posargs}
"""


def _diff(path: str, before: str, after: str, tmp: Path) -> str:
    (tmp / "a").write_text(before)
    (tmp / "b").write_text(after)
    out = subprocess.run(["git", "diff", "--no-index", "a", "b"], cwd=tmp, capture_output=True, text=True).stdout
    return out.replace("a/a", f"a/{path}").replace("b/b", f"b/{path}")


def _row(tmp: Path, iid: str, *, tox: bool, p2p: list[str], gold: str = "    return 2\n") -> dict[str, Any]:
    src = tmp / "src" / iid
    (src / "pkg").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "pkg" / "__init__.py").write_text(SOURCE)
    (src / "tests" / "test_v.py").write_text(TESTS)
    if tox:
        (src / "tox.ini").write_text(TOX_INI)
    commit = init_repo(src, tmp / "repos" / iid)
    recipe: dict[str, Any] = {"pip": ["pytest==8.3.4"], "history": "shallow", "log_parser": "sandgym-pytest"}
    if tox:  # swebench's sphinx spec: tox and tox-current-env in the env, tests through tox
        recipe.update(pip=["pytest==8.3.4", "tox==4.16.0", "tox-current-env==0.0.11"],
                      test_cmd="tox --current-env -epy311 -v -- {tests}")
    return {"instance_id": iid, "repo": "local/harness", "base_commit": commit, "repo_path": str(tmp / "repos" / iid),
            "patch": _diff("pkg/__init__.py", SOURCE, SOURCE.replace("    return 1\n", gold), tmp),
            "test_patch": _diff("tests/test_v.py", TESTS, TESTS + NEW_TEST, tmp),
            "FAIL_TO_PASS": ["tests/test_v.py::test_value"], "PASS_TO_PASS": p2p, "recipe": recipe}


async def _run(rows: list[dict[str, Any]], step: str) -> dict[str, InstanceResult]:
    async with SandboxManager("docker", max_sandboxes=2) as mgr:
        results = await SWEDebugRunner(mgr, step=step).run([SWETask.model_validate(r) for r in rows], concurrency=2)
        assert mgr.live == 0
    return {r.instance_id: r for r in results}


@pytest.mark.anyio
async def test_tox_current_env_runs_the_tests_inside_the_venv(tmp_path: Path) -> None:
    require("docker")
    row = _row(tmp_path, "local__tox-1", tox=True, p2p=["tests/test_v.py::test_keep", "tests/test_v.py::test_inside_a_venv"])
    gold = (await _run([row], "gold_patch"))["local__tox-1"]
    assert gold.status == "resolved", (gold.error, gold.logs.get("tests", "")[-3000:])
    log = gold.logs["tests"]
    # tox ran the command (the file's network tests fail: not listed, so not graded).
    assert "py311: commands[0]> python -m pytest" in log and "No module named pytest" not in log
    assert gold.pass_to_pass == {"tests/test_v.py::test_keep": "passed", "tests/test_v.py::test_inside_a_venv": "passed"}
    empty = (await _run([row], "none"))["local__tox-1"]
    assert empty.status == "unresolved" and empty.failing_tests == ["tests/test_v.py::test_value"]
    assert empty.network_tests == {}


@pytest.mark.anyio
async def test_tests_that_need_the_network_are_told_apart(tmp_path: Path) -> None:
    require("docker")
    net = ["tests/test_v.py::test_reach_out", "tests/test_v.py::test_resolve_a_name"]
    only = _row(tmp_path, "local__net-only", tox=False, p2p=["tests/test_v.py::test_keep", *net])
    both = _row(tmp_path, "local__net-and-real", tox=False, p2p=["tests/test_v.py::test_keep", *net],
                gold="    return 3\n")  # a gold patch that does not fix it
    res = await _run([only, both], "gold_patch")
    # The fix works; only the tests that reach out failed: the sandbox's fault, not the patch's.
    r = res["local__net-only"]
    assert r.status == "infra" and r.infra_reason == "network" and not r.resolved, (r.status, r.error)
    assert set(r.network_tests) == set(net) and r.failing_tests == net
    assert "Network is unreachable" in r.network_tests[net[0]]
    assert "need the network" in (r.error or "") and "--network-allow" in (r.error or "") and net[0] in (r.error or "")
    # A real failure beside them keeps the instance unresolved; the network ones are still named.
    r = res["local__net-and-real"]
    assert r.status == "unresolved" and "tests/test_v.py::test_value" in r.failing_tests
    assert set(r.network_tests) == set(net)


def test_validate_says_needs_network(tmp_path: Path) -> None:
    """`sandgym swe validate`: an instance whose only problem is the network is `needs_network`,
    naming the tests; the exit status says not every instance is valid."""
    require("docker")
    net = ["tests/test_v.py::test_reach_out"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_row(tmp_path, "local__net-val", tox=False, p2p=["tests/test_v.py::test_keep", *net])) + "\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "sandgym", "swe", "validate", str(rows), "--runs", "1", "--json",
                           "-o", str(tmp_path / "val")], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 1, proc.stderr
    summ = json.loads(proc.stdout)
    (inst,) = summ["instances"]
    assert inst["verdict"] == "needs_network" and inst["network_tests"] == net and inst["network"] == 1, inst
    assert summ["needs_network"] == [{"instance_id": "local__net-val", "tests": net}] and summ["invalid"] == []
    assert "0/1 valid, 1 need the network" in " ".join(proc.stderr.split())


@pytest.mark.anyio
async def test_agentic_fix_whose_only_failures_need_the_network_is_undecided(tmp_path: Path) -> None:
    """swe_agent: the oracle's fix is right, and only the tests that reach out fail; the
    rollout is an infra failure of scoring naming them, not a reward of 0."""
    require("docker")
    from sandgym.core.policies import get_policy
    from sandgym.swe.agentic import SWEAgentEnv

    net = ["tests/test_v.py::test_reach_out"]
    row = _row(tmp_path, "local__net-agent", tox=False, p2p=["tests/test_v.py::test_keep", *net])
    env = SWEAgentEnv([SWETask.model_validate(row)])
    async with env.sandbox_session("docker", max_sandboxes=1) as mgr:
        (state,) = await env.generate(get_policy("oracle", env), "oracle", max_concurrent=1, split="eval")
    assert mgr.live == 0
    assert state.error is not None and "need the network" in state.error and net[0] in state.error, state.error
    assert state.error_kind == "scoring" and state.info["swe"]["network_tests"].keys() == set(net)
