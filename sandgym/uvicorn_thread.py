"""An ASGI app served by uvicorn on a loopback port in a daemon thread: the platform's server
for tests and benchmarks (platform.testing), the trainer's OpenAI-compatible server
(train.backends.openai_server) and the stand-in model server (core.testing). It knows
nothing of what it serves; uvicorn is imported when one starts.

A server may also offer its app to clients in its own process (`offer_in_process`): they then
call the app directly (an ASGI transport: the same requests and answers, no socket, no HTTP
parsing on either side). The trainer's inference server does, for its own rollouts."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

# Apps this process serves that its own clients may call directly, by origin (scheme://host:port),
# with the pid that offered them: a forked child has the dict but not the server's threads.
_IN_PROCESS: dict[str, tuple[int, Any]] = {}


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}"


def offer_in_process(url: str, app: Any) -> None:
    """Let clients in this process that are given `url` (or any URL on its origin) call `app`."""
    _IN_PROCESS[_origin(url)] = (os.getpid(), app)


def withdraw_in_process(url: str) -> None:
    _IN_PROCESS.pop(_origin(url), None)


def app_in_process(url: str) -> Any | None:
    """The app offered for `url`'s origin by this process, or None (then use the socket)."""
    offered = _IN_PROCESS.get(_origin(url)) if _IN_PROCESS else None
    return offered[1] if offered is not None and offered[0] == os.getpid() else None


class UvicornThread:
    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, name: str = "sandgym-http", **config: Any) -> None:
        """`config`: uvicorn.Config's options (log_level "warning" unless given)."""
        self.app = app
        self.host = host
        self.port = port
        self.name = name
        self.config = {"log_level": "warning", **config}
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Bind `host:port` (port 0: a free one, then in `port`), serve, and return once uvicorn
        is up; RuntimeError, with uvicorn's own error when it had one, when it does not come up
        within `timeout` seconds."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, **self.config))
        self._thread = threading.Thread(target=self._run, args=(sock,), name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"{self.name} did not start: {self._error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start within {timeout:g} s")
            time.sleep(0.01)

    def _run(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        except BaseException as exc:  # surfaced by start()
            self._error = exc

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to finish (requests in progress end first) and wait up to `timeout` s."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
