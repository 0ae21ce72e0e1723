"""The agentic SWE environment on the real Docker engine: the oracle (gold patch through the
editor) scores 1.0, `null` scores 0, and the editor behaves as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.core.policies import get_policy
from sandgym.core.state import State
from sandgym.swe.agentic import SWEAgentEnv
from sandgym.swe.bundled import BROKEN, init_repo
from sandgym.swe.tasks import SWETask
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


def _good(bundled: dict[str, SWETask]) -> list[SWETask]:
    return [t for iid, t in bundled.items() if iid not in BROKEN]


@pytest.mark.parametrize("policy,reward", [("oracle", 1.0), ("null", 0.0)])
async def test_policies(bundled: dict[str, SWETask], policy: str, reward: float) -> None:
    require("docker")
    env = SWEAgentEnv(_good(bundled))
    async with env.sandbox_session("docker", max_sandboxes=2) as mgr:
        states = await env.generate(get_policy(policy, env), policy, max_concurrent=2, split="eval")
        assert mgr is not None
    assert mgr.live == 0
    assert len(states) == 4
    for s in states:
        assert s.error is None, s.error
        assert s.reward == reward, (s.info["instance_id"], s.info.get("swe"))
        assert s.metrics["pass_to_pass_rate"] == 1.0
    if policy == "oracle":
        for s in states:
            calls = s.turns[0].completion["tool_calls"]
            assert all(c["function"]["name"] == "str_replace_editor" for c in calls)
            assert all(not m["content"].startswith("Error") for m in s.turns[0].env_response)
            assert s.info["swe"]["diff"].startswith("diff --git")
    else:
        assert all(s.info["swe"]["failing_tests"] for s in states)


async def test_oracle_creates_a_whole_file_when_a_hunk_is_not_unique(tmp_path: Path) -> None:
    """Two identical blocks: the hunk's text occurs twice, so `str_replace` cannot place it;
    the oracle writes the patched file with `create` instead (and still resolves)."""
    require("docker")
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    block = "def f():\n    return 1\n"
    (src / "twins.py").write_text(f"# first\n{block}\n\n# second\n{block}")
    (src / "tests" / "test_twins.py").write_text("import twins\n\ndef test_exists():\n    assert twins.f() == 1\n")
    commit = init_repo(src, tmp_path / "repo")
    patch = ("diff --git a/twins.py b/twins.py\n--- a/twins.py\n+++ b/twins.py\n@@ -7,2 +7,2 @@\n"
             " def f():\n-    return 1\n+    return 2\n")
    test_patch = ("diff --git a/tests/test_twins.py b/tests/test_twins.py\n--- a/tests/test_twins.py\n+++ b/tests/test_twins.py\n"
                  "@@ -1,4 +1,4 @@\n import twins\n \n def test_exists():\n-    assert twins.f() == 1\n+    assert twins.f() == 2\n")
    task = SWETask(instance_id="twins__second", repo="local/twins", base_commit=commit, repo_path=str(tmp_path / "repo"),
                   patch=patch, test_patch=test_patch, FAIL_TO_PASS=["tests/test_twins.py::test_exists"],
                   problem_statement="f() should return 2", recipe={"pip": ["pytest==8.3.4"]})
    env = SWEAgentEnv([task])
    async with env.sandbox_session("docker", max_sandboxes=1):
        (state,) = await env.generate(get_policy("oracle", env), "oracle", split="eval")
    assert state.error is None and state.reward == 1.0, state.info.get("swe")
    (call,) = state.turns[0].completion["tool_calls"]
    assert '"command": "create"' in call["function"]["arguments"]


async def test_editor_commands(bundled: dict[str, SWETask]) -> None:
    require("docker")
    env = SWEAgentEnv([bundled["slugger__collapse-runs"]])
    async with env.sandbox_session("docker", max_sandboxes=1):
        state = env.init_state(env.rows()[0])
        await env.setup_state(state)
        sb = state.scratch["sandbox"]
        try:
            ed = env.str_replace_editor
            listing = await ed("view", ".", sandbox=sb)
            assert "/testbed/slugger/text.py" in listing and ".git/" not in listing
            view = await ed("view", "slugger/text.py", view_range=[4, 5], sandbox=sb)
            assert view.splitlines()[0].strip().startswith("4") and "def slugify" in view
            with pytest.raises(ValueError, match="does not occur"):
                await ed("str_replace", "slugger/text.py", old_str="nope", new_str="x", sandbox=sb)
            with pytest.raises(ValueError, match=r"occurs \d+ times"):
                await ed("str_replace", "slugger/text.py", old_str='"', new_str="'", sandbox=sb)
            out = await ed("str_replace", "slugger/text.py", old_str='"-", text', new_str='"_", text', sandbox=sb)
            assert "Edited" in out and '"_", text' in out
            await ed("insert", "slugger/text.py", insert_line=0, new_str="# header", sandbox=sb)
            text = (await sb.read_file("slugger/text.py")).decode()
            assert text.startswith("# header\nimport re\n") and '"_", text' in text
            await ed("create", "notes/new.txt", file_text="hello\n", sandbox=sb)
            assert (await sb.read_file("/testbed/notes/new.txt")) == b"hello\n"
            # A tool error reaches the model as a message, not as a crash.
            msg = await env.call_tool({"function": {"name": "str_replace_editor", "arguments": '{"command": "view", "path": "missing.py"}'}}, [], state)
            assert msg.startswith("Error")
            assert (await env.resolved(state, sb)) == 0.0  # "_" separators: still unresolved
        finally:
            await env.release_sandbox(state)
    assert isinstance(state, State)
