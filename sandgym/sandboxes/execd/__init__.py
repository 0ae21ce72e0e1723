"""execd: the in-sandbox exec daemon (daemon.py, stdlib only, runs inside the sandbox), its
host-side async client (client.py), the transport adapter over it (transport.py) and
live processes run by it (live.py).

execd stays provider-neutral, here and not under providers/docker/: it is a generic daemon
that any container runtime can run (one read-only mount for its code, one read-write mount
for its unix socket, `execd_command()` as the main process) and that speaks only its own
framing over that socket. Nothing in this package knows about Docker. What is specific to
one runtime lives with its provider: for Docker, providers/docker/execd.py holds the
per-container socket directories, the Docker SDK mount form, the kill sweep of processes
that left their group, and the fallback to `docker exec` for images without python3.
See client.py's docstring for how a provider starts it.
"""

from .client import (
    CONTAINER_EXECD_DIR,
    CONTAINER_SOCKET_DIR,
    EGRESS_PORT,
    EGRESS_SOCKET_NAME,
    EXECD_DIR,
    LIFELINE_NAME,
    SERVER_PATH,
    SOCKET_NAME,
    BatchJob,
    ExecdClient,
    ExecdConnectionLost,
    ExecdRequestError,
    ExecdRestartedError,
    ExecdUnresponsiveError,
    ensure_bytecode,
    execd_command,
)
from .live import ExecdLiveProcess
from .transport import ExecdTransport

__all__ = [
    "CONTAINER_EXECD_DIR",
    "CONTAINER_SOCKET_DIR",
    "EGRESS_PORT",
    "EGRESS_SOCKET_NAME",
    "EXECD_DIR",
    "LIFELINE_NAME",
    "SERVER_PATH",
    "SOCKET_NAME",
    "BatchJob",
    "ExecdClient",
    "ExecdConnectionLost",
    "ExecdLiveProcess",
    "ExecdRequestError",
    "ExecdRestartedError",
    "ExecdTransport",
    "ExecdUnresponsiveError",
    "ensure_bytecode",
    "execd_command",
]
