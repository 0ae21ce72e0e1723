"""A live `sandgym serve` (uvicorn on 127.0.0.1, random port) for the SDK tests.

The SDK is used unmodified: it finds the server through PRIME_API_BASE_URL / PRIME_API_KEY,
and HOME points at a temp dir so its ~/.prime auth cache is the test's own.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from sandgym.platform.testing import ServerThread, default_backend, serve_in_thread
from tests.conftest import CI, lacking, require

TOKEN_A = "tok-a-" + secrets.token_hex(8)
TOKEN_B = "tok-b-" + secrets.token_hex(8)
IMAGE = "sandgym/python:latest"


def backend() -> str:
    """docker when ready (always under CI=true, where a missing engine must fail, not fall
    back), else local; SANDGYM_PLATFORM_BACKEND=local|docker forces one."""
    return os.environ.get("SANDGYM_PLATFORM_BACKEND") or ("docker" if CI else default_backend())


def need_docker_backend(what: str) -> None:
    """For what only the docker provider has (images, vm, egress): the docker backend, ready."""
    if backend() != "docker":
        lacking(f"{what} needs the docker provider; the platform tests run on {backend()} here")
    require("docker")


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = str(tmp_path_factory.mktemp("home"))
    old = os.environ.get("HOME")
    os.environ["HOME"] = home
    yield home
    if old is not None:
        os.environ["HOME"] = old


@pytest.fixture(scope="module")
def server(isolated_home: str) -> Iterator[ServerThread]:
    if backend() == "docker":
        require("docker")
    with serve_in_thread([TOKEN_A, TOKEN_B], backend(), max_sandboxes=8, quota=6) as srv:
        old = {k: os.environ.get(k) for k in ("PRIME_API_BASE_URL", "PRIME_API_KEY")}
        os.environ["PRIME_API_BASE_URL"] = srv.url
        os.environ["PRIME_API_KEY"] = TOKEN_A
        try:
            yield srv
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
