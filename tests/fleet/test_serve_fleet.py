"""`sandgym serve --ray ADDRESS`: one Prime-compatible endpoint in front of the fleet; the
unmodified prime-sandboxes SDK creates sandboxes that land on the cluster's nodes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import require

from .conftest import node_containers

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_fronts_the_fleet(cluster: Any, tmp_path: Path) -> None:
    require("prime_sandboxes")
    from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}  # the SDK's auth cache is ours
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandgym", "serve", "--port", str(port), "--token", "fleet-token",
         "--ray", cluster.address, "--max-sandboxes", "4", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        api = APIClient(api_key="fleet-token")
        api.base_url = url
        client = SandboxClient(api)
        made = [client.create(CreateSandboxRequest(name=f"f{i}", docker_image="sandgym/python:latest", memory_gb=0.25,
                                                   cpu_cores=0.25, disk_size_gb=0.05))
                for i in range(3)]
        for sb in made:
            client.wait_for_creation(sb.id)
        r = client.execute_command(made[0].id, "echo from-the-fleet; id -u")
        out, uid = r.stdout.split()
        assert out == "from-the-fleet" and uid != "0" and r.exit_code == 0
        on_nodes = node_containers(cluster.names)
        assert len(on_nodes) >= 3  # the sandboxes are the nodes' containers
        for sb in made:
            client.delete(sb.id)
        deadline = time.monotonic() + 60
        while len(node_containers(cluster.names)) > len(on_nodes) - 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(node_containers(cluster.names)) <= len(on_nodes) - 3
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _serve(port: int, address: str, state: Path, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home)}
    return subprocess.Popen(
        [sys.executable, "-m", "sandgym", "serve", "--port", str(port), "--token", "fleet-token", "--ray", address,
         "--max-sandboxes", "4", "--state-dir", str(state), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )


def _up(proc: subprocess.Popen[str], url: str) -> None:
    for _ in range(1200):
        try:
            if httpx.get(f"{url}/health", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)
    raise AssertionError("sandgym serve --ray did not come up")


def test_serve_fleet_keeps_its_sandboxes_across_restarts(cluster: Any, tmp_path: Path) -> None:
    """`serve --ray --state-dir` stops (SIGINT, then SIGTERM: exit 0, no traceback) and starts
    again on the same state: its sandboxes stay RUNNING on their nodes with their files, as
    on a single host; deleted, they leave nothing on the nodes."""
    require("prime_sandboxes")
    from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

    port, state = _free_port(), tmp_path / "state"
    url = f"http://127.0.0.1:{port}"
    before = set(node_containers(cluster.names))
    proc = _serve(port, cluster.address, state, tmp_path)
    made: list[str] = []
    try:
        _up(proc, url)
        api = APIClient(api_key="fleet-token")
        api.base_url = url
        client = SandboxClient(api)
        made = [client.create(CreateSandboxRequest(name=f"k{i}", docker_image="sandgym/python:latest", memory_gb=0.25,
                                                   cpu_cores=0.25, disk_size_gb=0.05)).id for i in range(2)]
        client.bulk_wait_for_creation(made)
        for sid in made:
            client.upload_bytes(sid, "/workspace/kept.txt", f"kept {sid}".encode(), "kept.txt")
        on_nodes = set(node_containers(cluster.names)) - before
        assert len(on_nodes) == 2
        for sig in (signal.SIGINT, signal.SIGTERM):
            proc.send_signal(sig)
            out = proc.communicate(timeout=120)[0]
            assert proc.returncode == 0 and "Traceback" not in out, (sig, proc.returncode, out[-3000:])
            assert set(node_containers(cluster.names)) - before == on_nodes  # still on their nodes
            proc = _serve(port, cluster.address, state, tmp_path)
            _up(proc, url)
            for sid in made:
                got = client.get(sid)
                assert got.status == "RUNNING", (sig, got.status, got.error_message)
                r = client.execute_command(sid, "cat /workspace/kept.txt")
                assert r.stdout == f"kept {sid}" and r.exit_code == 0, r
        for sid in made:
            client.delete(sid)
        deadline = time.monotonic() + 60
        while set(node_containers(cluster.names)) & on_nodes and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not set(node_containers(cluster.names)) & on_nodes
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
