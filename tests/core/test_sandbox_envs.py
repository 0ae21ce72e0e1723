"""SandboxEnv / PythonEnv against real sandboxes (Docker engine; the local provider too when
it is in the checkout), driven by the mock OpenAI server over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from sandgym.core.clients import OpenAIClient
from sandgym.core.python_env import PythonEnv
from sandgym.core.sandbox_env import SandboxEnv
from sandgym.core.testing import MockOpenAIServer, Reply, last_user
from sandgym.sandboxes.manager import SandboxManager
from sandgym.sandboxes.spec import SandboxSpec
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

SPEC = SandboxSpec(cpu=0.5, memory_mb=256, disk_mb=64)


def require_provider(name: str) -> None:
    if name == "docker":
        require("docker")


@pytest.fixture(params=["docker", "local"])
async def manager(request: pytest.FixtureRequest) -> AsyncIterator[SandboxManager]:
    require_provider(request.param)
    async with SandboxManager(request.param, max_sandboxes=4) as mgr:
        yield mgr
    assert mgr.live == 0


def py(code: str) -> Reply:
    return Reply(tool_calls=[{"name": "python", "arguments": {"code": code}}])


async def test_python_env_persists_variables_and_restarts_after_crash_and_timeout(manager: SandboxManager) -> None:
    script = [
        py("x = 41\ndef f(v):\n    return v + 1"),
        py("print('hello')\nf(x)"),
        py("1/0"),
        py("import os\nos._exit(3)"),  # the REPL process dies
        py("x"),  # fresh REPL: x is gone
        py("import time\ntime.sleep(60)"),  # past the timeout
        py("y = 5\ny * 2"),
        py("import os, threading\nthreading.Timer(0.2, os._exit, (0,)).start()"),  # dies after the cell
        Reply(tool_calls=[{"name": "python", "arguments": {"code": "y"}}], delay_s=1.5),
        Reply(content="done"),
    ]
    with MockOpenAIServer(script) as srv:
        env = PythonEnv(dataset=[{"question": "use python", "answer": ""}], sandbox_spec=SPEC, command_timeout_s=3, max_turns=20)
        env.bind_sandboxes(manager)
        client = OpenAIClient(srv.base_url, max_retries=0)
        state = await env.rollout(client, "m", env.rows()[0])
        await client.aclose()
    assert state.error is None, state.error
    out = [t.env_response[0]["content"] for t in state.turns[:-1]]
    assert out[0] == "(no output)"
    assert out[1] == "hello\n42"
    assert "ZeroDivisionError: division by zero" in out[2] and "repl.py" not in out[2]
    assert "the Python REPL crashed" in out[3]
    assert "NameError: name 'x' is not defined" in out[4]
    assert out[5].startswith("TimeoutError: execution exceeded 3s")
    assert out[6] == "10"
    assert out[7] == "(no output)"
    assert out[8].startswith("[the Python REPL had stopped and was restarted: earlier variables are gone]\n")
    assert "NameError: name 'y' is not defined" in out[8]
    assert manager.live == 0  # released after the rollout
    assert [s["function"]["name"] for s in env.tool_schemas] == ["python"]
    assert "sandbox" not in env.tool_schemas[0]["function"]["parameters"]["properties"]


async def test_bash_env_and_a_sandbox_that_dies_mid_rollout(manager: SandboxManager) -> None:
    """Three rollouts; the sandbox of one is removed through the provider between its tool
    calls. That rollout ends with an error; the other two succeed."""
    sandboxes: dict[str, str] = {}

    env = SandboxEnv(dataset=[{"question": q, "answer": ""} for q in ["a", "DIE", "b"]], sandbox_spec=SPEC)
    orig_setup = env.setup_sandbox

    async def setup_sandbox(sb, state):
        await orig_setup(sb, state)
        q = state.prompt[-1]["content"]
        sandboxes[q] = sb.id

    env.setup_sandbox = setup_sandbox  # type: ignore[method-assign]

    def responder(body):
        q = last_user(body)
        n_tools = sum(1 for m in body["messages"] if m["role"] == "tool")
        if n_tools == 0:
            return Reply(tool_calls=[{"name": "bash", "arguments": {"command": "echo $((6*7)) > /workspace/f; cat /workspace/f; whoami"}}])
        if n_tools == 1:
            # the DIE rollout's second call comes late: the test removes its sandbox meanwhile
            return Reply(tool_calls=[{"name": "bash", "arguments": {"command": "cat /workspace/f"}}], delay_s=2.0 if q == "DIE" else 0)
        return Reply(content="finished")

    env.bind_sandboxes(manager)
    with MockOpenAIServer(responder) as srv:
        client = OpenAIClient(srv.base_url, max_retries=0)
        results = {}

        async def run(row):
            results[row["question"]] = await env.rollout(client, "m", row)

        async def killer() -> None:
            while "DIE" not in sandboxes or not any(
                last_user(r) == "DIE" and any(m["role"] == "tool" for m in r["messages"]) for r in list(srv.requests)
            ):
                await anyio.sleep(0.05)
            await manager.provider.remove(sandboxes["DIE"])

        async with anyio.create_task_group() as tg:
            for row in env.rows():
                tg.start_soon(run, row)
            tg.start_soon(killer)
        await client.aclose()

    dead = results["DIE"]
    # docker reports SandboxGoneError; the local provider a SandboxError (it cannot spawn)
    assert dead.error is not None and dead.error.startswith(("SandboxGoneError", "SandboxError")), dead.error
    assert dead.stop_reason == "error" and dead.reward == 0.0
    for q in ("a", "b"):
        s = results[q]
        assert s.error is None, s.error
        assert s.turns[0].env_response[0]["content"] == "42\nsandbox"
        assert s.turns[1].env_response[0]["content"] == "42"
        assert s.sandbox_id == sandboxes[q]
    assert manager.live == 0  # all released, the dead one included
