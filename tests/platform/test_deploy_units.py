"""deploy/systemd: the socket + service pair is valid for systemd (`systemd-analyze verify`),
and the service's command line, as the unit gives it, serves under real socket activation
(Debian's `systemd-socket-activate` plays the socket unit's part: it listens on the unit's
ListenStream and hands the socket over by LISTEN_FDS), survives its ExecReload (SIGHUP: a
re-exec in place) and stops with exit 0 on SIGTERM (the unit's KillSignal)."""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import require

from .procs import ROOT, _free_port, serve_env, sighup_and_wait_reexec, wait_healthy

UNITS = ROOT / "deploy" / "systemd"
INSTALLED_CLI = "/opt/sandgym/venv/bin/sandgym"


def _unit(name: str) -> dict[str, list[str]]:
    """key -> values of a unit file (continuation lines joined; comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", (UNITS / name).read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_units_verify(tmp_path: Path) -> None:
    require("systemd")
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None
    fake = tmp_path / "sandgym"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    for unit in UNITS.iterdir():
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED_CLI, str(fake)))
    names = [str(tmp_path / u.name) for u in UNITS.iterdir()]
    out = subprocess.run([analyze, "verify", *names], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    service, socket_unit = _unit("sandgym-serve.service"), _unit("sandgym-serve.socket")
    assert "sandgym-serve.socket" in service["Requires"][0] and service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert socket_unit["ListenStream"] == ["127.0.0.1:8000"]


def test_service_command_under_socket_activation(tmp_path: Path, isolated_home: str) -> None:
    require("systemd")
    activate = shutil.which("systemd-socket-activate")
    assert activate is not None
    env_vars = dict(
        line.split("=", 1) for line in (ROOT / "deploy" / "serve.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    command = _unit("sandgym-serve.service")["ExecStart"][0]
    command = re.sub(r"\$\{(\w+)\}", lambda m: env_vars[m.group(1)], command)
    token = "deploy-token"
    (tmp_path / "tokens").write_text(f"{token} ops\n")
    argv = shlex.split(command.replace("/etc/sandgym/tokens", str(tmp_path / "tokens"))
                       .replace("/var/lib/sandgym/serve", str(tmp_path / "state")))
    assert argv[0] == INSTALLED_CLI
    argv = [sys.executable, "-m", "sandgym", *argv[1:]]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")
    # systemd-socket-activate execs the service (same pid) on the first connection.
    proc = subprocess.Popen([activate, "-l", f"127.0.0.1:{port}", *argv], stdout=log, stderr=subprocess.STDOUT, env=serve_env())
    try:
        wait_healthy(url, lambda: proc.poll() is None)
        sighup_and_wait_reexec(proc.pid, url, token)  # ExecReload
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        assert httpx.get(f"{url}/api/v1/sandbox", headers={"Authorization": f"Bearer {token}"}, timeout=60).status_code == 200
        proc.send_signal(signal.SIGTERM)  # KillSignal
        assert proc.wait(120) == 0, (tmp_path / "serve.log").read_text()
        text = (tmp_path / "serve.log").read_text()
        assert "socket passed by LISTEN_FDS" in text and "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
