"""`sandgym serve` as a real child process (restartable), for tests that stop and start it:
bound by itself (`ServeProcess`), or handed its listening socket by a parent that keeps it
open across restarts, as systemd's socket unit does (`ActivatedServe`). Also what restart
tests check against: a loopback HTTP target for egress (`HostTarget`) and an image without
python3 (`no_python_image`)."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prime_sandboxes import APIClient, SandboxClient

from .conftest import backend

ROOT = Path(__file__).resolve().parents[2]
NO_PYTHON = "sandgym-test/no-python:latest"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker_containers(*labels: str, running: bool = False) -> list[str]:
    """Ids of containers carrying all `labels` (key=value); with `running`, only running ones."""
    filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
    out = subprocess.run(["docker", "ps", "-q" if running else "-aq", *filters], capture_output=True, text=True)
    return out.stdout.split()


def left_after_deletes(state: Path) -> list[str]:
    """Containers of the state still there a while after every delete (then removed)."""
    for _ in range(120):
        if not _docker_containers(f"platform.state={state.resolve()}"):
            break
        time.sleep(0.25)
    leftover = _docker_containers(f"platform.state={state.resolve()}")
    if leftover:  # shown with a failing test's output: what state they were left in
        shown = subprocess.run(["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Status}} {{.Labels}}",
                                "--filter", f"label=platform.state={state.resolve()}"], capture_output=True, text=True)
        print("left after their deletes:\n" + shown.stdout)
        subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)
    return leftover


def serve_argv(port: int | None, *args: str) -> list[str]:
    where = ["--port", str(port)] if port is not None else []
    return [sys.executable, "-m", "sandgym", "serve", *where, "--provider", backend(), "--log-level", "warning", *args]


def serve_env() -> dict[str, str]:
    """This checkout's code in the child, whatever the installed sandgym is."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def wait_healthy(url: str, alive: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if not alive():
            raise AssertionError("sandgym serve exited")
        time.sleep(0.1)
    raise AssertionError("sandgym serve did not come up")


def uptime(url: str, token: str) -> float:
    r = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    r.raise_for_status()
    return float(r.json()["uptime_s"])


def sighup_and_wait_reexec(pid: int, url: str, token: str, timeout_s: float = 120.0) -> None:
    """SIGHUP the server (re-exec in place, same pid) and wait until an image started after
    the signal answers (its requests wait in the backlog meanwhile)."""
    while uptime(url, token) < 1.0:  # so the old image's start is clearly before the signal
        time.sleep(0.1)
    sent = time.time()
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if time.time() - uptime(url, token) > sent:
            return
        time.sleep(0.1)
    raise AssertionError(f"sandgym serve (pid {pid}) did not re-exec within {timeout_s}s")


class ServeProcess:
    """`python -m sandgym serve` as a child process on a free port."""

    def __init__(self, *args: str, port: int | None = None) -> None:
        self.args = args
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            serve_argv(self.port, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=serve_env(),
        )
        try:
            wait_healthy(self.url, lambda: self.proc.poll() is None)
        except AssertionError:
            if self.proc.poll() is not None:
                raise AssertionError(self.proc.stdout.read() if self.proc.stdout else "serve exited") from None
            raise

    def client(self, token: str) -> SandboxClient:
        api = APIClient(api_key=token)
        api.base_url = self.url  # the SDK's public attribute; no env needed
        return SandboxClient(api)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(60)

    def restart(self, sig: int = signal.SIGTERM) -> int:
        """Stop with `sig`, start again on the same port and arguments; the stop's status."""
        code = self.stop(sig)
        self.proc = ServeProcess(*self.args, port=self.port).proc
        return code

    def reexec(self, token: str) -> None:
        """SIGHUP (re-exec in place, same pid), and wait until the new image serves."""
        sighup_and_wait_reexec(self.proc.pid, self.url, token)

    def output(self) -> str:
        if self.proc.poll() is None or self.proc.stdout is None:
            return ""
        return self.proc.stdout.read()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ActivatedServe:
    """systemd's role, for real: this object holds the listening socket (bound once) and
    starts `sandgym serve` as a child with it as fd 3 and LISTEN_FDS=1, LISTEN_PID=<child>,
    as a `.socket` unit does. Stopping the child leaves the socket open, so clients that
    connect while no server runs wait in its backlog."""

    def __init__(self, *args: str, log_path: Path) -> None:
        self.args = args
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(2048)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.pid = 0
        self.starts = 0

    def start(self) -> int:
        """Fork and exec the server (does not wait for it: the socket already accepts)."""
        argv = serve_argv(None, *self.args)
        env = serve_env()
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        pid = os.fork()
        if pid == 0:  # the child: only fd juggling and exec (this process may have threads)
            try:
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                if self.sock.fileno() == 3:
                    os.set_inheritable(3, True)
                else:
                    os.dup2(self.sock.fileno(), 3)  # inheritable
                env.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        os.close(log_fd)
        self.pid, self.starts = pid, self.starts + 1
        return pid

    def send(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout_s: float = 120.0) -> int:
        """Reap the server; its exit status (negative: killed by a signal)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        raise AssertionError(f"sandgym serve (pid {self.pid}) did not stop within {timeout_s}s")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int:
        """Signal the server and reap it; its exit status."""
        self.send(sig)
        return self.wait(timeout_s)

    def alive(self) -> bool:
        return self.pid != 0 and os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def close(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0
        self.sock.close()


class HostTarget:
    """An HTTP server on a loopback port of this host: what a sandbox whose egress names
    host.sandgym.internal reaches through `sandgym serve --egress-host-port PORT`."""

    BODY = b"host-target-ok"
    SLOW_CHUNKS = 40

    def __init__(self) -> None:
        body = self.BODY

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/slow"):  # SLOW_CHUNKS KiB over SLOW_CHUNKS/10 seconds
                    self.send_response(200)
                    self.send_header("Content-Length", str(HostTarget.SLOW_CHUNKS * 1024))
                    self.end_headers()
                    for _ in range(HostTarget.SLOW_CHUNKS):
                        self.wfile.write(b"x" * 1024)
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, name="host-target", daemon=True).start()

    def fetch_command(self) -> str:
        """A command printing the target's answer, or `refused <code>` when the proxy says no."""
        url = f"http://host.sandgym.internal:{self.port}/"
        return (
            "python3 -c \"import urllib.request as u, urllib.error as e\n"
            f"try: print(u.urlopen('{url}', timeout=20).read().decode())\n"
            "except e.HTTPError as x: print('refused', x.code)\n"
            "except Exception as x: print('unreachable', type(x).__name__)\""
        )

    def slow_download_command(self, out: str) -> str:
        """Start, in the background, a download of /slow into `out` (`out.done` when whole)."""
        url = f"http://host.sandgym.internal:{self.port}/slow"
        script = f"import urllib.request as u; d = u.urlopen('{url}', timeout=60).read(); open('{out}', 'wb').write(d)"
        return f"(python3 -c \"{script}\" && touch {out}.done) > {out}.log 2>&1 &"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def no_python_image() -> str:
    """A local image without python3 (so no execd: its sandboxes run over `docker exec`)."""
    out = subprocess.run(
        ["docker", "build", "-q", "-t", NO_PYTHON, "-"],
        input="FROM sandgym/base:latest\nRUN rm -f /usr/bin/python3* /usr/local/bin/python3*\n",
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return NO_PYTHON
