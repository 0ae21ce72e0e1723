"""The README's two commands: `sandgym ray up` starts a local cluster of sandgym nodes on
127.0.0.1 and returns once it is up; `sandgym eval ... --ray ADDRESS` runs on it;
`sandgym ray down` stops every node."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import require

from .conftest import node_containers

ROOT = Path(__file__).resolve().parents[2]


def test_ray_up_then_eval_on_it(tmp_path: Path) -> None:
    require("docker", "ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prefix = f"up{os.getpid()}-"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    addr_file = tmp_path / "address"
    up = subprocess.run(
        [sys.executable, "-m", "sandgym", "ray", "up", "--nodes", "2", "--max-sandboxes", "2", "--port", str(port),
         "--prefix", prefix, "--address-file", str(addr_file)],
        env=env, capture_output=True, text=True, timeout=400,
    )
    assert up.returncode == 0, up.stderr[-3000:]
    address = up.stdout.strip().splitlines()[-1]
    assert address == addr_file.read_text().strip() == f"127.0.0.1:{port}"
    pid = int((Path(tempfile.gettempdir()) / f"sandgym-ray-{port}" / "pid").read_text())
    try:
        ev = subprocess.run([sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "oracle", "-n", "12",
                             "--ray", address, "-o", str(tmp_path / "run"), "--json"],
                            env=env, capture_output=True, text=True, timeout=600)
        assert ev.returncode == 0, ev.stderr[-3000:]
        summary = json.loads(ev.stdout.strip().splitlines()[-1])
        assert (summary["passed"], summary["num_rollouts"]) == (12, 12)
        assert sorted(summary["fleet"]["rollouts_by_node"]) == [f"{prefix}0", f"{prefix}1"]
        st = subprocess.run([sys.executable, "-m", "sandgym", "ray", "status", "--ray", address, "--json"],
                            env=env, capture_output=True, text=True, timeout=300)
        assert st.returncode == 0, st.stderr[-3000:]
        nodes = json.loads(st.stdout.strip().splitlines()[-1])["nodes"]
        assert [(n["node"], n["state"], n["cap"]) for n in nodes] == [(f"{prefix}0", "ready", 2), (f"{prefix}1", "ready", 2)]
    finally:
        dn = subprocess.run([sys.executable, "-m", "sandgym", "ray", "down", "--port", str(port)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert dn.returncode == 0, dn.stderr[-3000:]
    assert not os.path.exists(f"/proc/{pid}")  # the cluster's process is gone, and its nodes with it
    assert not node_containers([f"{prefix}0", f"{prefix}1"])  # the agents destroyed their sandboxes


def test_an_address_where_nothing_listens_fails_fast() -> None:
    """Ray itself retries such an address for minutes; sandgym says so and exits 2."""
    require("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once the socket closes: nothing listens there
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "sandgym", "ray", "status", "--ray", f"127.0.0.1:{port}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in p.stderr
