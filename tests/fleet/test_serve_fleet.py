"""`sandgym serve --ray ADDRESS`: one Prime-compatible endpoint in front of the fleet; the
unmodified prime-sandboxes SDK creates sandboxes that land on the cluster's nodes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import node_containers

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_fronts_the_fleet(cluster: Any, tmp_path: Path) -> None:
    pytest.importorskip("prime_sandboxes")
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
