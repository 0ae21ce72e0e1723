"""Shared fixtures: real providers (docker engine, local processes, prime via `sandgym serve`)."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import AsyncIterator

import pytest

from sandgym.sandboxes import Provider, SandboxSpec, get_provider


@functools.cache
def docker_ready() -> str | None:
    """None when the engine answers and the default image exists, else the reason."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get(SandboxSpec().image)
    except Exception as exc:  # engine down or image missing
        return f"docker not ready: {exc!r} (run .ci/run or `sandgym images build`)"
    return None


def require_docker() -> None:
    reason = docker_ready()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _make_provider(name: str) -> AsyncIterator[Provider]:
    if name == "docker":
        require_docker()
        yield get_provider("docker")
    elif name == "local":
        yield get_provider("local")
    elif name == "prime":
        if importlib.util.find_spec("sandgym.platform.testing") is None:
            pytest.skip("prime provider needs sandgym.platform.testing (platform service) to serve on 127.0.0.1")
        from sandgym.platform.testing import prime_provider_for_tests

        async with prime_provider_for_tests() as p:
            yield p
    else:  # pragma: no cover
        raise ValueError(name)


@pytest.fixture(params=["docker", "local", "prime"])
async def provider(request: pytest.FixtureRequest) -> AsyncIterator[Provider]:
    """Every provider, for the shared contract suite."""
    gen = _make_provider(request.param)
    p = await gen.__anext__()
    try:
        yield p
    finally:
        await gen.aclose()
        await p.aclose()
