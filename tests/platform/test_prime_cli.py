"""The unmodified `prime` CLI 0.18 (in its own cached venv: it would downgrade typer here)
against `sandgym serve` as a process, including a server restart in the middle of the run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prime_sandboxes import APIClient, SandboxClient

from .clienvs import cached_venv
from .conftest import IMAGE, backend
from .procs import ServeProcess, _docker_containers

PRIME = ["prime==0.18.*"]
TOKEN = "cli-token"
ID = re.compile(r"\bsb[0-9a-f]{22}\b")


@pytest.fixture(scope="module")
def prime_bin() -> Path:
    return cached_venv("prime-0.18", PRIME) / "prime"


class Cli:
    def __init__(self, exe: Path, home: Path, url: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.exe = exe
        self.env = {
            "PATH": os.environ["PATH"], "HOME": str(home), "PRIME_API_BASE_URL": url, "PRIME_API_KEY": TOKEN,
            "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb",
        }

    def __call__(self, *args: str, ok: bool = True) -> str:
        out = subprocess.run([str(self.exe), *args], env=self.env, capture_output=True, text=True, timeout=180)
        text = out.stdout + out.stderr
        if ok:
            assert out.returncode == 0, (args, text)
        else:
            assert out.returncode != 0, (args, text)
        return text

    def wait_running(self, sid: str) -> str:
        """Wait with the SDK (a CLI call costs a second or two of start-up), then show it."""
        api = APIClient(api_key=TOKEN)
        api.base_url = self.env["PRIME_API_BASE_URL"]
        SandboxClient(api).wait_for_creation(sid)
        text = self("sandbox", "get", sid, "--plain")
        assert re.search(r"Status\s+RUNNING", text), text
        return text


@pytest.fixture
def served(tmp_path: Path, isolated_home: str) -> Iterator[ServeProcess]:
    state = tmp_path / "state"
    args = ("--token", TOKEN, "--state-dir", str(state), "--max-sandboxes", "4", "--output-limit-mb", "0.01")
    srv = ServeProcess(*args)
    srv.args = args  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.__exit__()
        leftover = _docker_containers(f"platform.state={state.resolve()}")
        if leftover:
            subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)


def test_prime_cli_every_sandbox_command(prime_bin: Path, served: ServeProcess, tmp_path: Path) -> None:
    cli = Cli(prime_bin, tmp_path / "clihome", served.url)
    who = cli("whoami")
    assert "sandbox" in who and re.search(r"User ID\W+u[0-9a-f]{16}", who), who

    made = cli("sandbox", "create", IMAGE, "--name", "cli-one", "--cpu-cores", "0.5", "--memory-gb", "0.5",
               "--disk-size-gb", "0.25", "--env", "GREETING=hello", "--label", "cli", "-y", "--plain")
    sid = ID.findall(made)[0]
    details = cli.wait_running(sid)
    # The effective network: nothing asked, the server's default is none.
    assert re.search(r"Network Access\s+Blocked", details), details
    listed = cli("sandbox", "list", "--plain")
    assert sid in listed and "RUNNING" in listed

    out = cli("sandbox", "run", sid, "--", "sh", "-c", "echo $GREETING; pwd")
    assert "hello" in out and "/workspace" in out
    out = cli("sandbox", "run", sid, "seq", "1", "20000")  # ~110 kB, past the 10 kB limit
    assert "output truncated" in out and str(int(0.01 * (1 << 20))) in out and "\n20000\n" not in out, out[-500:]
    src = tmp_path / "up.txt"
    src.write_text("uploaded by the CLI\n")
    cli("sandbox", "upload", sid, str(src), "/workspace/up.txt")
    back = tmp_path / "down.txt"
    cli("sandbox", "download", sid, "/workspace/up.txt", str(back))
    assert back.read_text() == "uploaded by the CLI\n"
    assert "upload /workspace/up.txt" in cli("sandbox", "logs", sid)

    net = cli("sandbox", "network", "egress", sid)
    assert "blocked" in net.lower()
    assert "blocked" in cli("sandbox", "network", "egress", sid, "--deny", "*").lower()
    refused = cli("sandbox", "network", "egress", sid, "--allow", "pypi.org", ok=False)
    assert "made without network" in refused

    # The server restarts in the middle of the run: the CLI's sandbox is still there.
    assert served.stop() in (0, -signal.SIGTERM)
    restarted = ServeProcess(*served.args, port=served.port)  # type: ignore[attr-defined]
    served.proc = restarted.proc
    assert re.search(r"Status\s+RUNNING", cli("sandbox", "get", sid, "--plain"))
    assert "uploaded by the CLI" in cli("sandbox", "run", sid, "cat", "/workspace/up.txt")

    second = ID.findall(cli("sandbox", "create", IMAGE, "--memory-gb", "0.5", "--cpu-cores", "0.5", "--disk-size-gb", "0.25", "-y", "--plain"))[0]
    cli.wait_running(second)
    cli("sandbox", "delete", sid, "-y")
    assert re.search(r"Status\s+TERMINATED", cli("sandbox", "get", sid, "--plain"))
    gone = cli("sandbox", "delete", "--all", "-y")  # needs the user id `whoami` saved
    assert second in gone
    assert sid not in cli("sandbox", "list", "--plain") and second not in cli("sandbox", "list", "--plain")
    if backend() == "docker":
        for _ in range(40):
            if not _docker_containers(f"platform.id={second}"):
                break
            time.sleep(0.25)
        assert _docker_containers(f"platform.id={second}") == []


def test_prime_cli_vm_and_allow_lists(prime_bin: Path, tmp_path: Path, isolated_home: str) -> None:
    """The vm profile and egress allow-lists through the CLI: writes to /work and /app, a
    create with --network-allow reported as "Limited to", the network changed at run time."""
    from .test_network import need_egress
    from .test_vm import need_vm

    need_vm()
    need_egress()
    state = tmp_path / "state"
    with ServeProcess("--token", TOKEN, "--state-dir", str(state), "--profile", "vm") as srv:
        try:
            cli = Cli(prime_bin, tmp_path / "clihome", srv.url)
            made = cli("sandbox", "create", IMAGE, "--memory-gb", "1", "--disk-size-gb", "0.5",
                       "--network-allow", "pypi.org", "--network-allow", "files.pythonhosted.org", "-y", "--plain")
            sid = ID.findall(made)[0]
            details = cli.wait_running(sid)
            assert re.search(r"Network Access\s+Limited to: pypi.org, files.pythonhosted.org", details), details
            src = tmp_path / "w.txt"
            src.write_text("to /work\n")
            cli("sandbox", "upload", sid, str(src), "/work/w.txt")
            out = cli("sandbox", "run", sid, "--", "sh", "-c", "mkdir -p /app && cp /work/w.txt /app/ && cat /app/w.txt && id -u")
            assert "to /work" in out and re.search(r"^0$", out, re.M), out
            out = cli("sandbox", "run", sid, "--", "pip", "download", "-q", "--no-deps", "-d", "/tmp/d", "six==1.16.0")
            assert "Exit Code" not in out or re.search(r"Exit Code\W+0", out), out
            assert "six-1.16.0" in cli("sandbox", "run", sid, "ls", "/tmp/d")
            net = cli("sandbox", "network", "egress", sid)
            assert "pypi.org" in net and "files.pythonhosted.org" in net, net
            assert "blocked" in cli("sandbox", "network", "egress", sid, "--deny", "*").lower()
            assert re.search(r"Network Access\s+Blocked", cli("sandbox", "get", sid, "--plain"))
            cli("sandbox", "network", "egress", sid, "--allow", "pypi.org")
            assert re.search(r"Network Access\s+Limited to: pypi.org", cli("sandbox", "get", sid, "--plain"))
            cli("sandbox", "delete", sid, "-y")
        finally:
            leftover = _docker_containers(f"platform.state={state.resolve()}")
            if leftover:
                subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)
