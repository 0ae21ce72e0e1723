"""A simulated 3-node Ray cluster on 127.0.0.1 (one raylet per node, one Docker engine), shared
by the fleet tests of a session. Node names carry this session's pid, so the containers its
agents make (labelled `sandgym.node=<name>`) are told apart from anyone else's. Tests that
kill a node bring it back before they end."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import require

NODE_CAP = 3  # sandboxes per node: small, the three nodes share two cores


@pytest.fixture(scope="session")
def cluster() -> Iterator[object]:
    require("docker", "ray")
    from sandgym.sandboxes.providers.ray.cluster import LocalCluster, connect

    names = [f"t{os.getpid()}n{i}" for i in range(3)]
    c = LocalCluster(names, max_sandboxes_per_node=NODE_CAP, num_gpus=2)
    c.start()
    connect(c.address)  # this process is a driver too
    try:
        yield c
    finally:
        c.shutdown()


def node_containers(names: list[str]) -> list[str]:
    """Ids of the containers (any state) labelled with one of these node names."""
    import docker

    client = docker.from_env()
    try:
        return [c.id for n in names for c in client.containers.list(all=True, filters={"label": f"sandgym.node={n}"})]
    finally:
        client.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
