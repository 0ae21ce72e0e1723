"""The provider contract on prime: the prime-sandboxes SDK against a real `sandgym serve` on
127.0.0.1 (in front of docker where it is ready, else local), one server for the module."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sandgym.sandboxes import Provider
from sandgym.sandboxes.contract import DEFAULT_SPEC
from tests.conftest import require
from tests.sandboxes.contract_cases import assert_contract

pytestmark = [pytest.mark.anyio, pytest.mark.requires("prime_sandboxes")]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def prime() -> AsyncIterator[Provider]:
    require("prime_sandboxes")
    from sandgym.platform.testing import prime_provider_for_tests

    async with prime_provider_for_tests() as p:
        yield p


async def test_prime(prime: Provider) -> None:
    await assert_contract(prime, DEFAULT_SPEC)
