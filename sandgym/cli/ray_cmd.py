"""`sandgym ray`: a local Ray cluster of sandgym nodes (`up`), and what a cluster's nodes hold
(`status`). Real machines join with plain `ray start ... --resources` (docs/scale-out.md)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

err = Console(stderr=True)

ray_app = typer.Typer(help="Ray clusters of sandgym nodes: sandboxes and rollouts across machines.", no_args_is_help=True)


@ray_app.command("up")
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Simulated nodes (the first is the head).")] = 3,
    max_sandboxes: Annotated[int, typer.Option("--max-sandboxes", help="Hard cap on live sandboxes per node.")] = 4,
    num_cpus: Annotated[float, typer.Option("--num-cpus", help="Ray CPUs per node (sandboxes do not use them).")] = 1,
    num_gpus: Annotated[float, typer.Option("--num-gpus", help="Logical GPUs per node (placement tests).")] = 0,
    port: Annotated[int, typer.Option("--port", help="The head's GCS port: the address is 127.0.0.1:PORT.")] = 6379,
    prefix: Annotated[str, typer.Option("--prefix", help="Node names are PREFIX0, PREFIX1, ...")] = "n",
    address_file: Annotated[Optional[Path], typer.Option("--address-file", help="Write the address here once the cluster is up.")] = None,
) -> None:
    """Start a Ray cluster of NODES sandgym nodes on 127.0.0.1 and keep it up until Ctrl-C or
    SIGTERM (then every node stops). The nodes share this machine and its Docker engine: a
    simulation for trying multi-node runs, not extra capacity."""
    from sandgym.fleet.cluster import LocalCluster

    if nodes < 1:
        raise typer.BadParameter("--nodes must be >= 1")
    cluster = LocalCluster([f"{prefix}{i}" for i in range(nodes)], max_sandboxes_per_node=max_sandboxes,
                           num_cpus=num_cpus, num_gpus=num_gpus, head_port=port)
    stop = threading.Event()
    try:
        address = cluster.start()
        for sig in (signal.SIGINT, signal.SIGTERM):  # after start: Ray's nodes set their own
            signal.signal(sig, lambda *_: stop.set())
        if address_file is not None:
            address_file.write_text(address + "\n")
        err.print(f"sandgym ray: {nodes} nodes ({', '.join(cluster.names)}), {max_sandboxes} sandboxes each, at [bold]{address}[/]")
        err.print(f"  sandgym eval humaneval --policy oracle --ray {address}")
        print(address, flush=True)
        stop.wait()
    finally:
        err.print("sandgym ray: stopping the nodes")
        cluster.shutdown()


@ray_app.command("status")
def status(
    ray: Annotated[str, typer.Option("--ray", envvar="RAY_ADDRESS", help="The cluster's address (HOST:PORT).")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """The cluster's sandgym nodes: state, cap, live and waiting sandboxes, what was pruned."""
    import anyio

    from sandgym.fleet.fleet import Fleet

    async def main() -> list[dict[str, Any]]:
        async with Fleet(ray, node_wait_s=30) as fleet:
            rows = fleet.status()
            for row, node in zip(rows, sorted(fleet.nodes.values(), key=lambda n: n.name)):
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
    Console().print(t)


def register(app: typer.Typer) -> None:
    app.add_typer(ray_app, name="ray")
