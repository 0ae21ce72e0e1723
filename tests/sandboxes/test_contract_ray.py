"""The provider contract on ray: the session's simulated Ray cluster on 127.0.0.1
(tests/conftest.py), its node agents running docker sandboxes, reached through
`get_provider("ray", ...)`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandgym.sandboxes import Provider, get_provider
from sandgym.sandboxes.contract import DEFAULT_SPEC
from tests.sandboxes.contract_cases import assert_contract

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker", "ray")]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def ray(cluster: Any) -> AsyncIterator[Provider]:
    p = get_provider("ray", address=cluster.address, agent_provider="docker")
    try:
        yield p
    finally:
        await p.aclose()


async def test_ray(ray: Provider) -> None:
    await assert_contract(ray, DEFAULT_SPEC)
