"""Run `sandgym serve` in-process for tests and benchmarks: a real uvicorn server on
127.0.0.1 (random free port) in a background thread, and a PrimeProvider pointed at it.

    with serve_in_thread(tokens=["t1"], provider="docker") as srv:
        ...  # srv.url, srv.service

    async with prime_provider_for_tests() as provider:   # the contract suite's fixture
        sb = await provider.create(spec, labels)
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from sandgym.sandboxes.base import Provider
from sandgym.uvicorn_thread import UvicornThread

from .app import create_app
from .service import ServerConfig, Service


class ServerThread:
    """uvicorn serving the platform app on 127.0.0.1 in a daemon thread."""

    def __init__(self, config: ServerConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.app = create_app(config)
        # asyncio's own loop (uvicorn would pick uvloop when installed): the one the platform
        # tests have always run this server on.
        self._http = UvicornThread(
            self.app, host=host, port=port, name="sandgym-serve", loop="asyncio", lifespan="on", timeout_keep_alive=30
        )

    @property
    def host(self) -> str:
        return self._http.host

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def service(self) -> Service:
        return self.app.state.service

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._http.start(timeout)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._http.stop(timeout)


@contextlib.contextmanager
def serve_in_thread(
    tokens: Sequence[str] | None = None,
    provider: str | Provider | None = None,
    **config: Any,
) -> Iterator[ServerThread]:
    """A live server; tears down every sandbox it made on exit."""
    cfg = ServerConfig(tokens=list(tokens or [secrets.token_hex(16)]), provider=provider or default_backend(), **config)
    srv = ServerThread(cfg).start()
    try:
        yield srv
    finally:
        srv.stop()


@functools.cache
def default_backend() -> str:
    """docker when the engine and the default image are there, else local."""
    try:
        import docker

        from sandgym.sandboxes.spec import SandboxSpec

        client = docker.from_env()
        client.ping()
        client.images.get(SandboxSpec().image)
        return "docker"
    except Exception:
        return "local"


@contextlib.asynccontextmanager
async def prime_provider_for_tests(
    servers: int = 1, backend: str | None = None, max_sandboxes: int = 8
) -> AsyncIterator[Provider]:
    """A PrimeProvider over `servers` fresh `sandgym serve` instances on 127.0.0.1, backed by
    `backend` (default: docker when ready, else local). The SDK's ~/.prime auth cache is
    shared per user: ids are globally unique, so concurrent servers do not collide."""
    from sandgym.sandboxes.providers.prime import PrimeProvider

    token = secrets.token_hex(16)
    with contextlib.ExitStack() as stack:
        state = stack.enter_context(tempfile.TemporaryDirectory(prefix="sandgym-prime-state-"))
        srvs = [
            stack.enter_context(serve_in_thread([token], backend or default_backend(), max_sandboxes=max_sandboxes))
            for _ in range(servers)
        ]
        provider = PrimeProvider(endpoints=[s.url for s in srvs], api_key=token, state_dir=state)
        try:
            yield provider
        finally:
            await provider.aclose()
