"""Starting the viewer: where it listens, whether it needs a token, and the URL to open."""

from __future__ import annotations

import ipaddress
import secrets
import socket
from pathlib import Path

from sandgym.errors import UserError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> set[str] | None:
    """The Host names the app answers to; refuses a non-loopback address without a token
    (trajectories, logs and patches would be readable by anyone who can reach it)."""
    if not is_loopback(host) and not token:
        raise UserError(f"--host {host} is not a loopback address: anyone who can reach it could read these runs; "
                        "give --token TOKEN (or --token auto) to require one")
    if host in ("0.0.0.0", "::", ""):
        return None  # every interface: any name (the token guards it)
    return {*LOOPBACK_NAMES, host.strip("[]").lower()}


def resolve_token(token: str | None) -> str | None:
    return secrets.token_urlsafe(24) if token == "auto" else token


def open_socket(host: str, port: int) -> socket.socket:
    """Bound before the server starts, so `--port 0` prints the port it got."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_for(host: str, port: int, token: str | None) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else (f"[{host}]" if ":" in host else host))
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def check_roots(paths: list[Path]) -> list[Path]:
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise UserError(f"not a folder: {', '.join(missing)} (give run folders, or a folder holding runs, e.g. runs/)")
    return paths
