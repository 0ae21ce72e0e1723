"""The server's listening socket, which outlives any one server process.

- **Socket activation** (systemd's protocol, sd_listen_fds(3)): a parent that holds the
  listening socket (systemd's `.socket` unit, `systemd-socket-activate`, or this process
  before a re-exec) passes it as fd 3 with `LISTEN_FDS=1` and `LISTEN_PID=<our pid>`. The
  socket stays open while the server restarts, so a client connecting meanwhile waits in
  the kernel's backlog instead of being refused.
- **Re-exec** (SIGHUP): the server execs itself in place (same pid) with its socket at fd 3
  and the same variables set, which is socket activation by itself. The client connections
  it kept open between two requests follow as fds 4, 5, ... (named CONNECTION), so the new
  process answers their next requests: no client sees a connection closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

log = logging.getLogger(__name__)

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
BACKLOG = 2048  # connections the kernel holds while no process accepts (a restart)


class ActivationError(Exception):
    """LISTEN_FDS names a descriptor that is not a listening stream socket."""


# LISTEN_FDNAMES entry of a client connection a re-exec hands over (not systemd's
# "connection", which names the one socket of an Accept=yes service).
CONNECTION = "sandgym-connection"


class HandOverError(OSError):
    """A re-exec could not set the sockets up for the new process (out of descriptors);
    nothing was changed."""


class Inherited(NamedTuple):
    """What the process that started this one passed by LISTEN_FDS: the listening socket,
    and (after a re-exec) the client connections it kept open between two requests."""

    listener: socket.socket | None
    connections: list[socket.socket]


def inherited_sockets(environ: dict[str, str] | None = None) -> Inherited:
    """The listening socket passed by LISTEN_FDS/LISTEN_PID (None when none was passed to
    this process), and the connections a re-exec handed over (named CONNECTION in
    LISTEN_FDNAMES). The variables are removed (as sd_listen_fds does) so children do not
    take the sockets for theirs; the descriptors are made close-on-exec."""
    env = os.environ if environ is None else environ
    pid, fds, names = env.get("LISTEN_PID"), env.get("LISTEN_FDS"), env.get("LISTEN_FDNAMES", "")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(name, None)
    if not fds or pid != str(os.getpid()):
        return Inherited(None, [])
    try:
        count = int(fds)
    except ValueError:
        raise ActivationError(f"LISTEN_FDS={fds!r} is not a number") from None
    labels = names.split(":") if names else []
    listener: socket.socket | None = None
    connections: list[socket.socket] = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + max(0, count)):
        label = labels[fd - LISTEN_FDS_START] if fd - LISTEN_FDS_START < len(labels) else ""
        if label == CONNECTION:
            try:
                conn = socket.socket(fileno=fd)
            except OSError:  # not a socket any more: nothing to serve
                with contextlib.suppress(OSError):
                    os.close(fd)
                continue
            conn.set_inheritable(False)
            connections.append(conn)
        elif listener is None:
            listener = _listening(fd)
        else:
            log.warning("LISTEN_FDS=%d: serving on the first socket (fd %d) only", count, listener.fileno())
    if listener is None and count > 0:
        for conn in connections:
            conn.close()
        raise ActivationError(f"LISTEN_FDS={count} passed no listening socket (LISTEN_FDNAMES={names!r})")
    return Inherited(listener, connections)


def _listening(fd: int) -> socket.socket:
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ActivationError(f"fd {fd} from LISTEN_FDS is not a socket: {exc}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ActivationError(f"fd {fd} from LISTEN_FDS is not a listening stream socket")
    sock.set_inheritable(False)
    return sock


def bind_socket(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def describe(sock: socket.socket) -> str:
    addr = sock.getsockname()
    if isinstance(addr, tuple):
        host, port = addr[0], addr[1]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    return f"unix:{addr}"


def reexec(
    fd: int, connections: Sequence[int] = (), argv: list[str] | None = None, environ: Mapping[str, str] | None = None,
) -> None:
    """Replace this process (same pid) by a fresh run of the same command line, handing it
    the listening socket `fd` as fd 3 by the socket-activation protocol, and the client
    `connections` as fds 4, 5, ... (named CONNECTION). Does not return."""
    fds = [fd, *connections]
    # Every source first moves above the target range, so no dup2 onto 3.. closes one. Out
    # of descriptors here (OSError), nothing has changed yet.
    high: list[int] = []
    try:
        for f in fds:
            high.append(fcntl.fcntl(f, fcntl.F_DUPFD_CLOEXEC, LISTEN_FDS_START + len(fds)))
    except OSError as exc:
        for f in high:
            os.close(f)
        raise HandOverError(exc.errno, f"cannot hand {len(fds)} sockets over: {exc.strerror}") from exc
    for i, f in enumerate(high):
        os.dup2(f, LISTEN_FDS_START + i, inheritable=True)
    env = dict(os.environ if environ is None else environ)
    env.update(LISTEN_FDS=str(len(fds)), LISTEN_PID=str(os.getpid()),
               LISTEN_FDNAMES=":".join(["http", *[CONNECTION] * len(connections)]))
    args = list(argv if argv is not None else sys.orig_argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, args, env)
