"""`sandgym ray`: a local Ray cluster of sandgym nodes (`up`), and what a cluster's nodes hold
(`status`). Real machines join with plain `ray start ... --resources` (docs/scale-out.md).

`up` runs the cluster with Ray's token authentication (RAY_AUTH_MODE=token; the token from
$RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, made there when there is none)
and without usage-stats reporting; drivers on this machine find the token by themselves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sandgym.cli.consoles import LazyConsole

err = LazyConsole(stderr=True)
out = LazyConsole()

ray_app = typer.Typer(help="Ray clusters of sandgym nodes: sandboxes and rollouts across machines.", no_args_is_help=True)


def _state_dir(port: int) -> Path:
    """Where a detached `sandgym ray up` keeps its pid, address and log."""
    return Path(tempfile.gettempdir()) / f"sandgym-ray-{port}"


@ray_app.command("up")
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Simulated nodes (the first is the head).")] = 3,
    max_sandboxes: Annotated[Optional[int], typer.Option(
        "--max-sandboxes", help="Hard cap on live sandboxes per node (default: what this machine's cores can score, "
                                "shared by the nodes).")] = None,
    num_cpus: Annotated[float, typer.Option("--num-cpus", help="Ray CPUs per node (sandboxes do not use them).")] = 1,
    num_gpus: Annotated[float, typer.Option("--num-gpus", help="Logical GPUs per node (placement tests).")] = 0,
    port: Annotated[int, typer.Option("--port", help="The head's GCS port: the address is 127.0.0.1:PORT.")] = 6379,
    prefix: Annotated[str, typer.Option("--prefix", help="Node names are PREFIX0, PREFIX1, ...")] = "n",
    address_file: Annotated[Optional[Path], typer.Option("--address-file", help="Write the address here once the cluster is up.")] = None,
    foreground: Annotated[bool, typer.Option("--foreground", help="Hold the cluster in this process until Ctrl-C or SIGTERM.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the cluster to come up.")] = 300,
) -> None:
    """Start a Ray cluster of NODES sandgym nodes on 127.0.0.1. It runs in the background
    once up (`sandgym ray down --port PORT` stops it) unless --foreground. The nodes share this
    machine and its Docker engine: a simulation for trying multi-node runs, not capacity."""
    if nodes < 1:
        raise typer.BadParameter("--nodes must be >= 1")
    if max_sandboxes is not None and max_sandboxes < 1:
        raise typer.BadParameter("--max-sandboxes must be >= 1")
    from sandgym.sandboxes.providers.ray.cluster import LocalCluster, enable_token_auth, shared_node_cap

    cap = max_sandboxes or shared_node_cap(nodes)
    if not foreground:
        token = enable_token_auth(generate=True)  # here, so a token made now is there before the nodes
        argv = ["ray", "up", "--foreground", "--nodes", str(nodes), "--max-sandboxes", str(cap),
                "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--port", str(port), "--prefix", prefix]
        _detach(argv, port, address_file, timeout, token)
        return
    cluster = LocalCluster([f"{prefix}{i}" for i in range(nodes)], max_sandboxes_per_node=cap,
                           num_cpus=num_cpus, num_gpus=num_gpus, head_port=port, auth=True)
    stop = threading.Event()
    try:
        address = cluster.start()
        for sig in (signal.SIGINT, signal.SIGTERM):  # after start: Ray's nodes set their own
            signal.signal(sig, lambda *_: stop.set())
        if address_file is not None:
            address_file.write_text(address + "\n")
        err.print(f"sandgym ray: {nodes} nodes ({', '.join(cluster.names)}), {cap} sandboxes each, at [bold]{address}[/] "
                  f"(token authentication)")
        print(address, flush=True)
        stop.wait()
    finally:
        err.print("sandgym ray: stopping the nodes")
        cluster.shutdown()


def _detach(argv: list[str], port: int, address_file: Optional[Path], timeout: float, token: str) -> None:
    """Run this same command with --foreground in a new session, wait until its cluster is
    up, and leave it running (pid, address and log in the state dir)."""
    state = _state_dir(port)
    pid_file = state / "pid"
    if pid_file.exists() and _alive(int(pid_file.read_text())):
        raise typer.BadParameter(f"a cluster on port {port} is running (pid {pid_file.read_text().strip()}); `sandgym ray down --port {port}`")
    state.mkdir(parents=True, exist_ok=True)
    addr = state / "address"
    addr.unlink(missing_ok=True)
    with open(state / "log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sandgym", *argv, "--address-file", str(addr)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while not addr.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.terminate()
            tail = (state / "log").read_text()[-3000:]
            raise typer.BadParameter(f"the cluster did not come up; its log ({state / 'log'}):\n{tail}")
        time.sleep(0.2)
    address = addr.read_text().strip()
    if address_file is not None:
        address_file.write_text(address + "\n")
    err.print(f"sandgym ray: up at [bold]{address}[/] (pid {proc.pid}, log {state / 'log'}); stop it with `sandgym ray down --port {port}`")
    err.print(f"  token authentication: drivers need RAY_AUTH_MODE=token and the token ({token}); sandgym's find it here")
    err.print(f"  sandgym eval humaneval --policy oracle --ray {address}")
    print(address, flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@ray_app.command("down")
def down(
    port: Annotated[int, typer.Option("--port", help="The port `sandgym ray up` was given.")] = 6379,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the nodes to stop.")] = 120,
) -> None:
    """Stop a cluster started by `sandgym ray up` (its agents destroy their sandboxes first)."""
    pid_file = _state_dir(port) / "pid"
    if not pid_file.exists() or not _alive(pid := int(pid_file.read_text())):
        err.print(f"sandgym ray: no cluster of ours on port {port}")
        pid_file.unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        raise typer.BadParameter(f"the cluster (pid {pid}) did not stop within {timeout:.0f}s")
    pid_file.unlink(missing_ok=True)
    err.print(f"sandgym ray: cluster on port {port} stopped")


@ray_app.command("status")
def status(
    ray: Annotated[str, typer.Option("--ray", envvar="RAY_ADDRESS", help="The cluster's address (HOST:PORT).")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """The cluster's sandgym nodes: state, cap, live and waiting sandboxes, what was pruned."""
    import anyio

    from sandgym.sandboxes.providers.ray import Fleet

    async def main() -> list[dict[str, Any]]:
        async with Fleet(ray, node_wait_s=30) as fleet:
            rows = fleet.status()
            for row, node in zip(rows, sorted(fleet.nodes.values(), key=lambda n: n.name), strict=True):
                if node.ready:
                    info = await fleet.call(node, "info")
                    row.update(live=info["live"], idle=info["idle"], waiting=info["waiting_creates"],
                               sessions=info["sessions"] - 1, pruned=len(info["pruned"]), pid=info["pid"])
            return rows

    rows = anyio.run(main)
    if as_json:
        print(json.dumps({"nodes": rows}))
        return
    from rich.table import Table

    t = Table(title=f"sandgym nodes at {ray}")
    for col in ("node", "state", "cap", "live", "idle", "waiting", "sessions", "pruned"):
        t.add_column(col)
    for r in rows:
        t.add_row(*(str(r.get(c, "-")) for c in ("node", "state", "cap", "live", "idle", "waiting", "sessions", "pruned")))
    out.print(t)


def register(app: typer.Typer) -> None:
    app.add_typer(ray_app, name="ray")
