"""The provider contract on docker: the strict profile, and the vm profile (root under
gVisor) where gVisor is here (required under CI=true)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sandgym.sandboxes import Provider, get_provider
from sandgym.sandboxes.contract import DEFAULT_SPEC
from tests.conftest import require
from tests.sandboxes.contract_cases import assert_contract

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker")]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def docker() -> AsyncIterator[Provider]:
    require("docker")
    p = get_provider("docker")
    try:
        yield p
    finally:
        await p.aclose()


async def test_strict(docker: Provider) -> None:
    await assert_contract(docker, DEFAULT_SPEC)


@pytest.mark.requires("vm")
async def test_vm(docker: Provider) -> None:
    await assert_contract(docker, DEFAULT_SPEC.model_copy(update={"profile": "vm"}))
