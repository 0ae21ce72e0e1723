"""The fleet tests' helpers; their cluster is tests/conftest.py's `cluster` (one per session:
a process joins one Ray cluster only)."""

from __future__ import annotations

import pytest

from tests.conftest import NODE_CAP

__all__ = ["NODE_CAP", "node_containers"]


def node_containers(names: list[str]) -> list[str]:
    """Ids of the containers (any state) labelled with one of these node names."""
    import docker

    client = docker.from_env()
    try:
        # The low-level listing: containers.list() inspects each one and races its removal.
        return [c["Id"] for n in names for c in client.api.containers(all=True, filters={"label": f"sandgym.node={n}"})]
    finally:
        client.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
