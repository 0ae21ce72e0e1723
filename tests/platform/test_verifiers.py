"""verifiers 0.4.0's `prime` runtime, unmodified, completes a rollout with its built-in `null`
harness against `sandgym serve`: the sandbox (vm profile, gVisor) installs the harness's
packages from PyPI through the server's default allow-list, and the harness reaches the
interception server on this host as host.sandgym.internal:PORT. verifiers lives in its own
cached venv (it would upgrade openai here); the test skips, saying why, when PyPI cannot be
reached or this engine cannot run vm sandboxes with egress. docs/platform.md has the command.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
from pathlib import Path

from sandgym.core.testing import MockOpenAIServer, Reply
from tests.conftest import require

from .clienvs import cached_venv
from .conftest import need_docker_backend
from .procs import ServeProcess, _docker_containers

FIXTURE = Path(__file__).parent / "vf_fixture"
TOKEN = "vf-token"
# What the harness's setup fetches: pip and uv from PyPI's index and files hosts.
ALLOW = "pypi.org,files.pythonhosted.org,host.sandgym.internal"
# Docker Hub is out of reach here, so python:3.11-slim is served (--image-alias) from a local
# stand-in: sandgym/python with what the real image has -- root by default and pip allowed
# to install (Debian's python refuses `pip install --user` under PEP 668; the official image,
# built into /usr/local, does not).
STAND_IN = "sandgym-test/python-slim-i12:3.11"
STAND_IN_DOCKERFILE = """FROM sandgym/python:latest
USER root
RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
"""


def _stand_in() -> str:
    out = subprocess.run(["docker", "build", "-q", "-t", STAND_IN, "-"], input=STAND_IN_DOCKERFILE,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return STAND_IN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vf_eval_command(vf_bin: Path, model_url: str, port: int) -> list[str]:
    """The command docs/platform.md gives (with the ports of this run)."""
    return [
        str(vf_bin / "vf-eval"), "tiny_tasks",
        "--env.agent.harness.id", "null",
        "--env.agent.runtime.type", "prime",
        "--env.interception.type", "server",
        "--env.interception.tunnel.type", "custom",
        "--env.interception.tunnel.url", f"http://host.sandgym.internal:{port}",
        "--env.interception.tunnel.port", str(port),
        "--client.base-url", model_url,
        "-m", "mock", "-r", "1", "-c", "1", "--push", "False",
    ]


def test_verifiers_prime_runtime_null_harness(tmp_path: Path, isolated_home: str) -> None:
    need_docker_backend("the prime runtime's vm sandboxes with egress")
    require("vm", "egress")
    vf_bin = cached_venv("verifiers-0.4.0", ["verifiers==0.4.0"])
    port = _free_port()
    state = tmp_path / "state"
    with MockOpenAIServer(default=Reply(content="hello")) as model:
        srv = ServeProcess(
            "--token", TOKEN, "--state-dir", str(state), "--max-sandboxes", "2",
            "--profile", "vm", "--egress-default", ALLOW, "--egress-host-port", str(port),
            "--image-alias", f"python:3.11-slim={_stand_in()}",
        )
        try:
            home = tmp_path / "home"
            home.mkdir()
            env = {
                "PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(FIXTURE),
                "PRIME_API_BASE_URL": srv.url, "PRIME_API_KEY": TOKEN,
            }
            out = subprocess.run(
                vf_eval_command(vf_bin, model.base_url, port), env=env, cwd=tmp_path,
                capture_output=True, text=True, timeout=1200,
            )
            log = out.stdout[-4000:] + out.stderr[-6000:]
            assert out.returncode == 0, log
            # The harness in the sandbox called the model through the interception server.
            assert model.requests, log
            traces = [t for f in glob.glob(str(tmp_path / "outputs" / "*" / "traces.jsonl"))
                      for line in Path(f).read_text().splitlines() if line.strip()
                      for t in json.loads(line)["traces"]]
            assert [t["errors"] for t in traces] == [[]], (traces, log)
            assert [t["rewards"]["answered"]["score"] for t in traces] == [1.0], log
        finally:
            srv.stop()
            leftover = _docker_containers(f"platform.state={state.resolve()}")
            if leftover:
                subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)
