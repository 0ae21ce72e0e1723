#!/usr/bin/env python3
"""sandgym execd (exec daemon): runs commands inside a sandbox for a host-side client.

Standard library only, Python >= 3.9, so any image with python3 can run it unchanged:

    python3 -I -S server.py --socket /run/sandgym/execd.sock [--ttl SECONDS]
                         [--owner-fifo /run/sandgym/lifeline --owner-grace SECONDS]

(server.py, the script, imports this module, from its .pyc when there is one.)

Wire format (both directions; framing.py, loaded from this folder): a frame is a 4-byte
big-endian length, that many bytes of UTF-8 JSON (the header), then raw payloads whose
lengths the header lists in "blobs". Bytes (stdin, stdout, file contents, tar archives)
therefore never pass through base64 or JSON.
A connection carries one request at a time; a client keeps several connections for
concurrency. Requests carry "op": ping, exec, python, batch_exec, read_file, write_file,
put_archive, get_archive, live, attach, signal, reset. Replies carry "ok" and either the op's
fields or "error": {"code", "message"}. An exec with "stream": true is preceded by
{"event": "output"} frames. "live" starts a live process that owns its connection from then
on (stdin frames in, output frames out, see run_live) and outlives it; "attach" makes another
connection its client (see Live); "signal" reaches such a process's group by its pid;
"reset" readies a reused sandbox for its next user without a process; "python" runs a
Python program (the stdin blob) as `python3 -` would, forked from a warm interpreter that
execd keeps (warm_python.py), under RLIMIT_CPU when "cpu_limit_s" is given.

Commands run in their own session (process group). Past their timeout, or when the client
hangs up mid-request, the whole group is SIGKILLed. Output is drained continuously and kept
up to the per-stream limit; the excess is read and dropped. Background children that outlive
their command are left alone (their later output is drained and dropped). Exit codes follow
the shell: 128+N for signal N, 124 on timeout; oom_killed = the cgroup's oom_kill counter
rose and the command died of SIGKILL. Commands get oom_score_adj 500 so an OOM kill picks
them before execd. batch_exec runs jobs on min(CPUs, cgroup CPU quota) threads unless
the request says "parallel".

execd exits (ending its container) after --ttl seconds and on SIGTERM/SIGINT, killing what it started,
and --owner-grace seconds after its owner's lifeline (--owner-fifo, a FIFO whose only
writer is the owning process on the host) reads end-of-file: the owner died (see
sandgym/sandboxes/ownership.py).
As the container's PID 1 (no docker-init) it splits in two (`init`): init holds the listening
socket, reaps orphans and starts the serving execd again when it is killed (from inside the
sandbox, by the OOM killer or from the host), so such a kill costs the requests in flight,
not the sandbox. The socket is made world-connectable (0777) because execd runs unprivileged
in the container while the host side connects as another user; the directory it lives in
must be writable by execd's uid when it starts (it is bound once, by init).
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

if TYPE_CHECKING:
    import tarfile

if __package__:  # imported as sandgym.sandboxes.execd.daemon (host-side tests)
    from .capped import CappedBuffer
    from .framing import FrameReader, encode, read_frame, recv_frame, send_frame
else:  # in the sandbox (server.py imports it); -I keeps this folder off sys.path
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from capped import CappedBuffer  # type: ignore[import-not-found, no-redef]
    from framing import FrameReader, encode, read_frame, recv_frame, send_frame  # type: ignore[import-not-found, no-redef]

PROTOCOL = 1
CHUNK = 1 << 16
# After the command exits, how long to keep collecting from pipes that background children
# still hold open (e.g. `server &`). Past that the result is sent; those children are not
# killed, and their later output is read and dropped (so they never see EPIPE).
LINGER_S = 0.25
# After a kill, how long to wait for the pipes to close before giving up on them.
KILL_DRAIN_S = 2.0
TIMEOUT_EXIT = 124  # sandgym.sandboxes.result.TIMEOUT_EXIT (stdlib only here: it cannot import it)


class RequestError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Stop(BaseException):
    """Raised in the main thread by the SIGTERM handler to leave accept() at once."""


# ----------------------------------------------------------------------------- processes


class Registry:
    """Process groups we started (to kill on exit), under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pids: set = set()
        self.stopping = False  # set on shutdown: no new commands after the final kill

    def kill_all(self) -> None:
        with self.lock:
            self.stopping = True
            pids = list(self.pids)
        for pid in pids:
            _killpg(pid)


REGISTRY = Registry()


class Drainer:
    """One thread that reads and discards what background children keep writing to pipes
    whose command already finished, closing each pipe at EOF."""

    def __init__(self) -> None:
        self.sel: Optional[selectors.BaseSelector] = None
        self.lock = threading.Lock()
        self.wake_w = -1

    def adopt(self, pipe: Any) -> None:
        with self.lock:
            if self.sel is None:
                self.sel = selectors.DefaultSelector()
                wake_r, self.wake_w = os.pipe()
                self.sel.register(wake_r, selectors.EVENT_READ, None)
                threading.Thread(target=self._run, name="drainer", daemon=True).start()
            self.sel.register(pipe, selectors.EVENT_READ, pipe)
            os.write(self.wake_w, b"x")

    def _run(self) -> None:
        assert self.sel is not None
        while True:
            for key, _ in self.sel.select():
                try:
                    data = os.read(key.fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if key.data is None or data:
                    continue  # a wake-up byte, or output nobody waits for
                with self.lock:
                    self.sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]  # selectors type fileobj as int | HasFileno; we registered pipe files


DRAINER = Drainer()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_COMMAND_OOM_SCORE = 500


def _prefer_for_oom(pid: int, score: int = _COMMAND_OOM_SCORE) -> None:
    """Make the OOM killer pick a command before execd (which holds buffered output), and
    execd before init (which takes the container with it). Raising a score needs no
    privilege."""
    try:
        with open("/proc/%d/oom_score_adj" % pid, "w") as f:
            f.write(str(score))
    except OSError:
        pass


class _ForkScore:
    """Commands are forked at _COMMAND_OOM_SCORE: execd raises its own score for the moment
    of the fork (under REGISTRY.lock, which every command's fork holds) and lowers it back.
    Writing the command's score once Popen has returned raced with the command's first
    children, which inherited execd's (a loaded machine saw `sh -c 'sleep 0.2; cat ...'`
    print 100); setting it in a preexec_fn would cost ~4 ms a command (no vfork). The file
    is opened before execd makes itself non-dumpable, after which /proc/<pid> is root's.
    Lowering needs no privilege down to the floor the container's runtime set; where it is
    refused (probed once), the command's score is written after the fork instead."""

    def __init__(self) -> None:
        self.fd = -1  # execd's own oom_score_adj, while the raise-and-lower works
        self.own = b""

    def probe(self) -> None:
        try:
            fd = os.open("/proc/self/oom_score_adj", os.O_RDWR)
        except OSError:
            return
        try:
            own = int(os.pread(fd, 16, 0))
            if own < _COMMAND_OOM_SCORE:
                os.pwrite(fd, b"%d" % (own + 1), 0)
                os.pwrite(fd, b"%d" % own, 0)
                self.fd, self.own = fd, b"%d" % own
                return
        except (OSError, ValueError):
            pass
        os.close(fd)

    def raised(self) -> bool:
        try:
            return self.fd >= 0 and os.pwrite(self.fd, b"%d" % _COMMAND_OOM_SCORE, 0) > 0
        except OSError:
            return False

    def lower(self) -> None:
        try:
            os.pwrite(self.fd, self.own, 0)
        except OSError:  # refused after all (the probe lowered it): execd keeps 500, later commands get theirs written
            os.close(self.fd)
            self.fd = -1


FORK_SCORE = _ForkScore()


_OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
_NO_OOM_FILE: set = set()  # those of _OOM_FILES found missing: never there (gVisor has none)


def _oom_kill_counter() -> Optional[int]:
    """The cgroup's OOM-kill count (v2 memory.events or v1 memory.oom_control). It counts
    kills of any process in the sandbox, so a command SIGKILLed by someone else while a
    concurrent one hit the limit would be reported as OOM too; rare and documented."""
    for path in _OOM_FILES:
        if path in _NO_OOM_FILE:
            continue
        try:
            with open(path, "rb") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == b"oom_kill":
                        return int(parts[1])
        except FileNotFoundError:
            _NO_OOM_FILE.add(path)
        except (OSError, ValueError):
            continue
    return None



_SPAWN_PATIENCE_S = 2.0  # how long a command's start waits for a pid (at most its timeout)


def _spawn(argv: List[str], deadline: float, *, stdin: Any, cwd: Optional[str],
           env: Optional[Dict[str, str]]) -> subprocess.Popen[bytes]:
    """Start a command in its own session, registered in REGISTRY. A fork refused for want
    of a pid (EAGAIN: the sandbox's pids limit is full, e.g. a fork bomb churning in the
    background) is retried for _SPAWN_PATIENCE_S or until `deadline`, as bash retries its
    forks: a pid freed for a moment goes to whoever asks first. A bomb that holds every pid
    for longer is refused with the fork's own error; the "reset" op ends it."""
    deadline = min(deadline, time.monotonic() + _SPAWN_PATIENCE_S)
    delay = 0.002
    while True:
        try:
            with REGISTRY.lock:
                if REGISTRY.stopping:
                    raise RequestError("stopping", "execd is shutting down")
                inherited = FORK_SCORE.raised()
                try:
                    proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, cwd=cwd, env=env,
                                            start_new_session=True, bufsize=0)
                finally:
                    if inherited:
                        FORK_SCORE.lower()
                REGISTRY.pids.add(proc.pid)
            if not inherited:
                _prefer_for_oom(proc.pid)
            return proc
        except OSError as exc:
            if exc.errno != errno.EAGAIN or time.monotonic() + delay >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _spawn_error(argv: List[str], exc: OSError, t0: float) -> Tuple[Dict[str, Any], bytes, bytes]:
    code = 127 if exc.errno == errno.ENOENT else 126
    msg = "sandgym-execd: cannot run %r: %s\n" % (argv[0] if argv else "", exc)
    return (_result(code, False, False, False, False, t0), b"", msg.encode())


def _result(code: int, timed_out: bool, oom: bool, t_out: bool, t_err: bool, t0: float) -> Dict[str, Any]:
    return {
        "exit_code": code,
        "timed_out": timed_out,
        "oom_killed": oom,
        "stdout_truncated": t_out,
        "stderr_truncated": t_err,
        "duration_s": round(time.monotonic() - t0, 6),
    }


def _exit_seen(proc: _Process, pidfd: int, exited_at: Optional[float], now: float) -> Optional[float]:
    """When the command's exit was first seen: from its pidfd's event (the caller's select),
    or, without a pidfd, by polling."""
    if exited_at is None and pidfd < 0 and proc.poll() is not None:
        return now
    return exited_at


def _drained(exited_at: Optional[float], open_pipes: int, now: float) -> bool:
    """Done collecting output: the command exited and its pipes closed, or LINGER_S passed
    since (background children still hold them)."""
    return exited_at is not None and (open_pipes == 0 or now >= exited_at + LINGER_S)


def run_command(
    argv: List[str],
    *,
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    stdin: Optional[bytes],
    timeout: float,
    limit: int,
    cancel_fd: Optional[int] = None,
    on_output: Optional[Callable[[str, bytes], None]] = None,
) -> Tuple[Dict[str, Any], bytes, bytes]:
    """Run one command to completion. Returns (result fields, stdout, stderr).

    `cancel_fd` becoming readable (the client hung up, or a batch was abandoned) kills the
    command's process group at once."""
    t0 = time.monotonic()
    if not argv or not all(isinstance(a, str) for a in argv):
        raise RequestError("bad_request", "argv must be a non-empty list of strings")
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update({str(k): str(v) for k, v in env.items()})
    oom_before = _oom_kill_counter()
    try:
        proc = _spawn(argv, t0 + timeout, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                      cwd=cwd or None, env=full_env)
    except OSError as exc:
        return _spawn_error(argv, exc, t0)
    try:
        return _supervise(proc, stdin, timeout, limit, cancel_fd, on_output, oom_before, t0)
    except BaseException:
        _killpg(proc.pid)  # e.g. the streaming client went away: never leave it unsupervised
        proc.wait()
        raise
    finally:
        with REGISTRY.lock:
            REGISTRY.pids.discard(proc.pid)


def _supervise(
    proc: _Process,
    stdin: Optional[bytes],
    timeout: float,
    limit: int,
    cancel_fd: Optional[int],
    on_output: Optional[Callable[[str, bytes], None]],
    oom_before: Optional[int],
    t0: float,
) -> Tuple[Dict[str, Any], bytes, bytes]:
    out, err = CappedBuffer(limit), CappedBuffer(limit)
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    open_pipes = 2
    live = {proc.stdout, proc.stderr}  # output pipes not yet at EOF
    sel.register(proc.stdout, selectors.EVENT_READ, ("out", out))
    sel.register(proc.stderr, selectors.EVENT_READ, ("err", err))
    view = memoryview(stdin or b"")
    sent = 0
    if stdin and proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, ("in", None))
    pidfd = -1
    try:  # pidfd: exit is an event like any other, no polling
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, ("exit", None))
    except (AttributeError, OSError):
        pidfd = -1
    if cancel_fd is not None:
        sel.register(cancel_fd, selectors.EVENT_READ, ("cancel", None))

    deadline = t0 + timeout
    killed_at: Optional[float] = None
    timed_out = False
    exited_at: Optional[float] = None
    finished = False
    try:
        while True:
            now = time.monotonic()
            exited_at = _exit_seen(proc, pidfd, exited_at, now)
            if _drained(exited_at, open_pipes, now):
                break
            if killed_at is None and now >= deadline:
                _killpg(proc.pid)
                killed_at, timed_out = now, True
            if killed_at is not None and open_pipes and now >= killed_at + KILL_DRAIN_S:
                break  # pipes held by something outside the group; stop waiting on them
            wait = (deadline if killed_at is None else killed_at + KILL_DRAIN_S) - now
            if exited_at is not None:
                wait = min(wait, exited_at + LINGER_S - now)
            if pidfd < 0:
                wait = min(wait, 0.01 if open_pipes == 0 else 0.05)
            for key, _ in sel.select(max(wait, 0.0)):
                tag, buf = key.data
                if tag == "out" or tag == "err":
                    try:
                        chunk = os.read(key.fd, CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(key.fileobj)
                        live.discard(key.fileobj)
                        open_pipes -= 1
                        continue
                    kept = buf.write(chunk)
                    if kept and on_output is not None:
                        on_output("stdout" if tag == "out" else "stderr", kept)
                elif tag == "in":
                    try:
                        sent += os.write(key.fd, view[sent : sent + CHUNK])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        sent = len(view)
                    if sent >= len(view):
                        sel.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]  # selectors type fileobj as int | HasFileno; we registered pipe files
                elif tag == "exit":
                    sel.unregister(key.fileobj)
                    exited_at = time.monotonic()
                elif tag == "cancel":
                    sel.unregister(key.fileobj)
                    if killed_at is None:
                        _killpg(proc.pid)
                        killed_at = time.monotonic()
        finished = True
    finally:
        sel.close()
        if pidfd >= 0:
            os.close(pidfd)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is None or pipe.closed:
                continue
            if finished and pipe in live:
                try:
                    DRAINER.adopt(pipe)  # still held by a background child
                except RuntimeError:  # no thread for the drainer (pids limit): let it go
                    pipe.close()
            else:
                try:
                    pipe.close()
                except OSError:
                    pass
    rc = proc.wait()
    code = 128 - rc if rc < 0 else rc
    oom = False
    if oom_before is not None and not timed_out and code == 128 + signal.SIGKILL:
        after = _oom_kill_counter()
        oom = after is not None and after > oom_before
    if timed_out:
        code = TIMEOUT_EXIT
    return (_result(code, timed_out, oom, out.truncated, err.truncated, t0), out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------------- warm python


class _Process(Protocol):
    """What _supervise needs of a command: a subprocess.Popen, or a _Forked program."""

    pid: int
    stdin: Optional[IO[bytes]]
    stdout: Optional[IO[bytes]]
    stderr: Optional[IO[bytes]]

    def poll(self) -> Optional[int]: ...

    def wait(self) -> int: ...


# PYTHON* variables the warm interpreter's child applies itself; any other sends the
# program to a fresh interpreter (warm_python.py says why).
_WARM_ENV_OK = ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")
_WARM_BOOT = "import sys; base = set(sys.modules); sys.path.insert(0, %r); import warm_python; warm_python.main(base)"
_WARM_STATUS_S = 5.0  # a child ended; its status must follow within this, or the interpreter is stuck
_WARM_START_TRIES = 3  # it died this often before ever forking: not usable here


def _others_running() -> bool:
    """Whether any process but init, this execd and the one that started it runs (a
    sandbox user's)."""
    mine = {1, os.getpid(), os.getppid()}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine:
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    return True
        except (OSError, IndexError):
            continue
    return False


class _Forked:
    """A program forked by the warm interpreter, as _supervise sees a Popen: its pid, its
    output pipes and its exit status (reported by the interpreter, its parent)."""

    stdin: Optional[IO[bytes]] = None  # the program came in its body: nothing more to send

    def __init__(self, out_r: int, err_r: int) -> None:
        self.pid = 0
        self.started = threading.Event()
        self.stdout: Optional[IO[bytes]] = os.fdopen(out_r, "rb", buffering=0)
        self.stderr: Optional[IO[bytes]] = os.fdopen(err_r, "rb", buffering=0)
        self.returncode: Optional[int] = None
        self.lost = False  # the interpreter died first: the exit status is unknown
        self.ended = threading.Event()

    def end(self, status: Optional[int]) -> None:
        if status is None:
            self.lost, self.returncode = True, 255
        else:
            self.returncode = os.waitstatus_to_exitcode(status)
        self.ended.set()

    def poll(self) -> Optional[int]:
        return self.returncode if self.ended.is_set() else None

    def wait(self) -> int:
        """Its exit status, once the interpreter reports it. Called once the program has
        ended or was killed; should no status follow, the program is killed again, a stopped
        interpreter killed, and at last any interpreter (its children are then lost)."""
        for last_resort in (False, False, True):
            if self.ended.wait(_WARM_STATUS_S):
                break
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            if last_resort or WARM.stopped():
                WARM.kill()
        self.ended.wait()
        assert self.returncode is not None
        return self.returncode


class WarmPython:
    """The warm interpreter (warm_python.py): started only while no sandbox user's process
    runs (so none can reach it before it is out of their reach), kept across `reset`,
    started again after the reset that follows its death."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.sock: Optional[socket.socket] = None
        self.pending: Dict[int, _Forked] = {}  # job id -> not yet forked
        self.children: Dict[int, _Forked] = {}  # pid -> running
        self.next_id = 0
        self.failed_starts = 0
        self.wanted = False  # a program asked for it: start it again at reset
        self.python = shutil.which("python3")
        self.unusable = self.python is None
        self._site = self._site_dirs()

    @staticmethod
    def _site_dirs() -> List[str]:
        try:
            import site

            return [d for d in site.getsitepackages() if os.path.isdir(d)]
        except Exception:
            return []

    def pid(self) -> Optional[int]:
        proc = self.proc
        return proc.pid if proc is not None else None

    def fits(self, job_env: Dict[str, str], full_env: Dict[str, str]) -> bool:
        """Whether a fresh `python3 -` would behave as a forked child does (else it runs)."""
        if self.unusable:
            return False
        if any(k.startswith("PYTHON") and k not in _WARM_ENV_OK for k in full_env):
            return False
        if any((k in ("LANG", "LANGUAGE") or k.startswith("LC_")) and v != os.environ.get(k) for k, v in job_env.items()):
            return False  # its streams' encoding was chosen at its start
        if "PATH" in job_env and shutil.which("python3", path=job_env["PATH"]) != self.python:
            return False  # another python3 (a virtualenv's)
        home = full_env.get("HOME")
        site = "%s/.local/lib/python%d.%d/site-packages" % (home, sys.version_info[0], sys.version_info[1])
        if home and os.path.isdir(site):
            return False
        # Packages a sandbox user can install (.pth files are read at an interpreter's start)
        return not any(os.access(d, os.W_OK) for d in self._site)

    def ensure(self) -> bool:
        """Start it if it is not running and no sandbox user's process runs; whether it
        runs. The caller holds REGISTRY.lock, so no command starts meanwhile."""
        self.wanted = True
        if self.sock is not None:
            return True
        if self.unusable or _others_running():
            return False
        try:
            self._start()
        except OSError:
            return False
        return True

    def _start(self) -> None:
        parent, child = socket.socketpair()
        try:
            proc = subprocess.Popen(
                ["python3", "-I", "-c", _WARM_BOOT % os.path.dirname(os.path.abspath(__file__)), str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,
            )
        except OSError:
            parent.close()
            self.unusable = True
            raise
        finally:
            child.close()
        try:
            parent.settimeout(10)
            hello = read_frame(parent.recv)  # sent once it is not dumpable
            parent.settimeout(None)
            if hello is None or not hello[0].get("ready"):
                raise OSError("the warm interpreter did not start")
            reader = threading.Thread(target=self._read, args=(parent, proc), name="warm-python", daemon=True)
            reader.start()
        except (OSError, EOFError, ValueError, RuntimeError) as exc:
            parent.close()
            proc.kill()
            proc.wait()
            self.failed_starts += 1
            self.unusable = self.unusable or self.failed_starts >= _WARM_START_TRIES
            raise OSError("the warm interpreter did not start: %r" % (exc,)) from None
        _prefer_for_oom(proc.pid)  # its children inherit the commands' score
        with self.lock:
            self.proc, self.sock = proc, parent

    def _read(self, sock: socket.socket, proc: subprocess.Popen[bytes]) -> None:
        while True:
            try:
                frame = read_frame(sock.recv)
            except (EOFError, OSError, ValueError):
                frame = None
            if frame is None:
                break
            msg = frame[0]
            with self.lock:
                if "id" in msg:
                    forked = self.pending.pop(int(msg["id"]), None)
                    if forked is not None:
                        self.failed_starts = 0
                        forked.pid = int(msg["pid"])
                        self.children[forked.pid] = forked
                        forked.started.set()
                elif "pid" in msg:
                    child = self.children.pop(int(msg["pid"]), None)
                    if child is not None:
                        child.end(int(msg["status"]))
        # Gone from the process table before anyone learns it is gone: a start that follows
        # must not see it as a sandbox user's process.
        try:
            proc.kill()
        except OSError:
            pass
        proc.wait()
        with self.lock:
            if self.sock is sock:
                self.proc = self.sock = None
            for forked in self.pending.values():
                forked.started.set()  # pid 0: not forked, the caller runs it elsewhere
            for child in self.children.values():
                child.end(None)
            self.pending.clear()
            self.children.clear()
        sock.close()

    def kill(self) -> None:
        proc = self.proc
        if proc is not None:
            try:
                proc.kill()  # the reader sees the hang-up and reports its children lost
            except OSError:
                pass

    def stopped(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
        except (OSError, IndexError):
            return False

    def after_reset(self) -> None:
        """Once no sandbox user's process runs: a stopped interpreter (SIGSTOP from a user:
        same uid) would hang the next user's programs, so it is killed; one that died is
        started again if programs used it."""
        if self.stopped():
            self.kill()
            end = time.monotonic() + 5
            while self.sock is not None and time.monotonic() < end:
                time.sleep(0.005)  # its reader lets go of it
        if self.wanted and self.sock is None:
            with REGISTRY.lock:
                self.ensure()

    def spawn(self, source: bytes, env: Dict[str, str], cwd: Optional[str], cpu_limit_s: Optional[int]) -> Optional[_Forked]:
        """The program forked and running, or None when the interpreter could not take it
        (then nothing of it ran)."""
        body_r, body_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        forked = _Forked(out_r, err_r)
        sent = False
        try:
            with self.lock:
                sock = self.sock
                if sock is not None:
                    self.next_id += 1
                    job_id = self.next_id
                    self.pending[job_id] = forked
                    try:
                        socket.send_fds(sock, [b"".join(encode({"id": job_id}))], [body_r, out_w, err_w])
                        sent = True
                    except OSError:
                        self.pending.pop(job_id, None)
        finally:
            for fd in (body_r, out_w, err_w):
                os.close(fd)
        if sent and not forked.started.wait(_WARM_STATUS_S):
            self.kill()
            forked.started.wait()
        if forked.pid:
            try:  # only the child reads it: no program enters the interpreter's memory
                # No cwd: execd's own, which an exec's command inherits (the interpreter's is /).
                for piece in encode({"env": env, "cwd": cwd or _own_cwd(), "cpu_limit_s": cpu_limit_s}, [source]):
                    _write_all(body_w, piece)
            except OSError:
                pass  # it died before reading: its exit status says so
        os.close(body_w)
        if not forked.pid:
            for pipe in (forked.stdout, forked.stderr):
                if pipe is not None:
                    pipe.close()
            return None
        return forked


def _own_cwd() -> Optional[str]:
    try:
        return os.getcwd()
    except OSError:  # removed under execd: the program gets the interpreter's /
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


WARM = WarmPython()


def run_python(
    source: bytes,
    *,
    cpu_limit_s: Optional[int],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    timeout: float,
    limit: int,
    cancel_fd: Optional[int] = None,
) -> Tuple[Dict[str, Any], bytes, bytes]:
    """Run a Python program as `python3 -` with it on stdin would (under RLIMIT_CPU when
    asked), forked from the warm interpreter when that behaves the same and runs, else in a
    fresh one. Returns what run_command returns."""
    t0 = time.monotonic()
    job_env = {str(k): str(v) for k, v in (env or {}).items()}
    full_env = dict(os.environ)
    full_env.update(job_env)
    proc = None
    oom_before = None
    if WARM.fits(job_env, full_env):
        oom_before = _oom_kill_counter()
        with REGISTRY.lock:
            if REGISTRY.stopping:
                raise RequestError("stopping", "execd is shutting down")
            ready = WARM.ensure()
        if ready:
            proc = WARM.spawn(source, full_env, cwd, cpu_limit_s)
    if proc is None:
        argv = ["python3", "-"] if not cpu_limit_s else ["sh", "-c", "ulimit -t %d && exec python3 -" % int(cpu_limit_s)]
        return run_command(argv, env=env, cwd=cwd, stdin=source, timeout=timeout, limit=limit, cancel_fd=cancel_fd)
    with REGISTRY.lock:
        REGISTRY.pids.add(proc.pid)
        stopping = REGISTRY.stopping
    if stopping:
        _killpg(proc.pid)
    try:
        res, out, err = _supervise(proc, None, timeout, limit, cancel_fd, None, oom_before, t0)
    except BaseException:
        _killpg(proc.pid)
        proc.wait()
        raise
    finally:
        with REGISTRY.lock:
            REGISTRY.pids.discard(proc.pid)
    if proc.lost and not res["timed_out"]:
        err += b"sandgym-execd: the warm interpreter that ran this program died; its exit status is unknown\n"
    return res, out, err


# ----------------------------------------------------------------------------- live processes


_STDIN_HIGH = 4 << 20  # stdin buffered for a process that does not read it: stop reading the client
_ENDED_KEPT = 64  # ended live processes kept for an attach (their exit status), the latest started


class Live:
    """A live process ("live" op): a command whose client streams its output, writes its
    stdin and signals it, and which outlives that client. The thread of the connection that
    started it (`supervise`) owns its pipes from start to exit, with at most one client
    attached. A client that hangs up leaves the process running, its stdin pipe open and its
    output read and dropped; another connection attaches to it by id ("attach" op: output
    from then on, stdin, the exit status), e.g. a platform server restarted on the same
    sandbox. Once it has ended its exit status is kept for an attach (the last `_ENDED_KEPT`)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.id = os.urandom(8).hex()
        self.lock = threading.Lock()  # guards code and arriving
        self.code: Optional[int] = None  # set once it has ended and all its output is out
        self.arriving: List[Tuple[socket.socket, threading.Event]] = []  # attaches to take over
        self.wake_r, self.wake_w = os.pipe()  # an attach wakes the supervisor
        self.conn: Optional[socket.socket] = None  # the attached client
        self.released: Optional[threading.Event] = None  # set when `conn` is let go (an attach's)
        self.frames = FrameReader()
        self.sel = selectors.DefaultSelector()
        self.watching_conn = False

    def started(self) -> Dict[str, Any]:
        return {"event": "started", "pid": self.proc.pid, "id": self.id}

    def _watch_conn(self, on: bool) -> None:
        if self.conn is None or on == self.watching_conn:
            return
        if on:
            self.sel.register(self.conn, selectors.EVENT_READ, "conn")
        else:
            self.sel.unregister(self.conn)
        self.watching_conn = on

    def _take(self, conn: socket.socket, released: Optional[threading.Event]) -> None:
        self.conn, self.released, self.frames = conn, released, FrameReader()
        self._send(self.started())

    def _let_go(self, error: Optional[str] = None) -> None:
        """Stop serving the attached client (it hung up, or another one attached: `error`)."""
        conn = self.conn
        if conn is None:
            return
        self._watch_conn(False)
        self.conn = None
        if error is not None:
            try:
                send_frame(conn, {"ok": False, "error": {"code": "detached", "message": error}})
            except OSError:
                pass
        try:
            conn.shutdown(socket.SHUT_RDWR)  # its connection thread closes it
        except OSError:
            pass
        if self.released is not None:
            self.released.set()
            self.released = None

    def _send(self, header: Dict[str, Any], blobs: Sequence[bytes] = ()) -> bool:
        if self.conn is None:
            return False
        try:
            send_frame(self.conn, header, blobs)
            return True
        except OSError:
            self._let_go()
            return False

    def supervise(self, conn: Optional[socket.socket]) -> None:
        """Relay between the process and whichever client is attached (first `conn`, which
        had the "started" frame) until it exits; then give its exit status to the client
        attached, or keep it for the next attach."""
        self.conn = conn
        try:
            self._relay()
        finally:
            self.sel.close()
            code = _reaped(self.proc)
            with self.lock:
                self.code = code
                arriving, self.arriving = self.arriving, []
            os.close(self.wake_r)
            os.close(self.wake_w)
            end = {"ok": True, "result": {"exit_code": code}}
            self._send(end)
            self._let_go()
            for c, released in arriving:
                try:
                    send_frame(c, self.started())
                    send_frame(c, end)
                except OSError:
                    pass
                released.set()
            # Kept for a later attach (a client may have hung up just as it was told).
            with REGISTRY.lock:
                ended = [k for k, lv in LIVE.items() if lv.code is not None]
                for k in ended[: max(0, len(ended) - _ENDED_KEPT)]:
                    del LIVE[k]

    def _relay(self) -> None:
        proc, sel = self.proc, self.sel
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self._watch_conn(True)
        os.set_blocking(proc.stdin.fileno(), False)
        pending = bytearray()  # stdin not yet taken by the process
        writing = False
        open_pipes = 2
        pidfd = -1
        try:
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        except (AttributeError, OSError):
            pidfd = -1
        exited_at: Optional[float] = None
        try:
            while True:
                now = time.monotonic()
                exited_at = _exit_seen(proc, pidfd, exited_at, now)
                if _drained(exited_at, open_pipes, now):
                    break
                wait: Optional[float] = None
                if exited_at is not None:
                    wait = exited_at + LINGER_S - now
                if pidfd < 0:
                    poll = 0.005 if open_pipes == 0 else 0.05
                    wait = poll if wait is None else min(wait, poll)
                for key, _ in sel.select(wait if wait is None else max(wait, 0.0)):
                    tag = key.data
                    if tag == "stdout" or tag == "stderr":
                        chunk = os.read(key.fd, CHUNK)
                        if not chunk:
                            sel.unregister(key.fileobj)
                            key.fileobj.close()  # type: ignore[union-attr]
                            open_pipes -= 1
                        else:  # with no client attached: dropped
                            self._send({"event": "output", "stream": tag}, [chunk])
                    elif tag == "conn":
                        conn = self.conn
                        if conn is None or key.fileobj is not conn:
                            continue  # let go earlier in this round
                        try:
                            data = conn.recv(CHUNK)
                            frames = self.frames.feed(data) if data else None
                        except (OSError, ValueError, RequestError):
                            frames = None
                        if frames is None:
                            self._let_go()  # hung up (or garbage): the process runs on
                            continue
                        for header, blobs in frames:
                            if header.get("op") == "stdin" and blobs and not proc.stdin.closed:
                                pending += blobs[0]
                    elif tag == "stdin":
                        try:
                            del pending[: os.write(key.fd, pending[:CHUNK])]
                        except BlockingIOError:
                            pass
                        except OSError:  # the process closed its stdin: what it did not read is lost
                            pending.clear()
                            sel.unregister(key.fileobj)
                            writing = False
                            proc.stdin.close()
                    elif tag == "exit":
                        sel.unregister(key.fileobj)
                        exited_at = time.monotonic()
                    elif tag == "wake":
                        os.read(self.wake_r, 64)
                        with self.lock:
                            arriving, self.arriving = self.arriving, []
                        for c, released in arriving:  # the last to attach is served
                            self._let_go("another client attached to this process")
                            self._take(c, released)
                        self._watch_conn(len(pending) <= _STDIN_HIGH)
                if not proc.stdin.closed:
                    if pending and not writing:
                        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
                        writing = True
                    elif not pending and writing:
                        sel.unregister(proc.stdin)
                        writing = False
                # A process that does not read its stdin: stop taking more from the client.
                if len(pending) > _STDIN_HIGH:
                    self._watch_conn(False)
                elif len(pending) <= _STDIN_HIGH // 4:
                    self._watch_conn(True)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            for pipe in (proc.stdout, proc.stderr):
                if not pipe.closed:  # still held by a background child (or we are failing)
                    try:
                        DRAINER.adopt(pipe)
                    except RuntimeError:
                        pipe.close()
            if not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass


LIVE: Dict[str, Live] = {}  # by id, under REGISTRY.lock: running, or ended (the last _ENDED_KEPT)


def _reaped(proc: subprocess.Popen[bytes]) -> int:
    rc = proc.wait()
    with REGISTRY.lock:
        REGISTRY.pids.discard(proc.pid)
    return 128 - rc if rc < 0 else rc


def run_live(conn: socket.socket, h: Dict[str, Any]) -> None:
    """Start a live process for this connection: {"event": "started", "pid", "id"} once it
    runs, then {"event": "output", "stream"} frames as output appears, then {"ok": true,
    "result": {"exit_code"}}. Meanwhile the client may send {"op": "stdin"} frames (one blob
    each), only after "started". No timeout and no output cap (the client reads as it goes;
    a client that stops reading stalls the process's output). See `Live` for a client that
    hangs up; "signal" reaches the process by pid."""
    argv = h.get("argv")
    if not argv or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise RequestError("bad_request", "argv must be a non-empty list of strings")
    env = h.get("env")
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update({str(k): str(v) for k, v in env.items()})
    try:
        proc = _spawn(argv, float("inf"), stdin=subprocess.PIPE,
                      cwd=h.get("cwd") or None, env=full_env)
    except OSError as exc:
        raise RequestError("spawn_failed", "cannot run %r: %s" % (argv[0], exc)) from None
    with REGISTRY.lock:
        live = Live(proc)
        LIVE[live.id] = live
    try:
        send_frame(conn, live.started())
    except OSError:  # the client went away already: the process runs on without one
        live.supervise(None)
        return
    live.supervise(conn)


def attach_live(conn: socket.socket, h: Dict[str, Any]) -> None:
    """Attach this connection to the live process `h["id"]`, as `run_live` describes from
    its "started" frame on; a client attached before is let go (error "detached"). An ended
    process answers "started" and its exit status at once."""
    live_id = str(h.get("id") or "")
    with REGISTRY.lock:
        live = LIVE.get(live_id)
    if live is None:
        raise RequestError("not_found", "no live process %r here (never started here, or ended long ago)" % live_id)
    released = threading.Event()
    with live.lock:
        code = live.code
        if code is None:
            live.arriving.append((conn, released))
            os.write(live.wake_w, b"x")
    if code is None:
        released.wait()  # the supervisor serves this connection until then
        return
    send_frame(conn, live.started())
    send_frame(conn, {"ok": True, "result": {"exit_code": code}})


def signal_live(pid: int, signum: int) -> bool:
    """Signal a running live process's group; False when it is not (or no longer) one of ours."""
    with REGISTRY.lock:
        if pid not in REGISTRY.pids or not any(lv.proc.pid == pid for lv in LIVE.values()):
            return False
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# ----------------------------------------------------------------------------- files


def _os_error(exc: OSError, path: str) -> RequestError:
    codes = {
        errno.ENOENT: "not_found",
        errno.EISDIR: "is_a_directory",
        errno.ENOTDIR: "not_a_directory",
        errno.EACCES: "permission_denied",
        errno.EPERM: "permission_denied",
        errno.EROFS: "read_only",
        errno.ENOSPC: "no_space",
    }
    return RequestError(codes.get(exc.errno or 0, "os_error"), "%s: %s" % (path, exc.strerror or exc))


def read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise _os_error(exc, path) from None


def write_file(path: str, data: bytes, mode: int) -> None:
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode & 0o7777)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode & 0o7777)  # O_CREAT's mode is masked by umask and skipped for existing files
        finally:
            os.close(fd)
    except OSError as exc:
        raise _os_error(exc, path) from None


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _safe_members(tar: tarfile.TarFile, dest: str) -> Iterator[tarfile.TarInfo]:
    """tarfile's "data" filter for Pythons that lack it (Debian bookworm's 3.11.2): no
    absolute or escaping names or links, no device files, no set-id bits, no ownership.
    A generator, so each member is checked against the tree as extracted so far."""
    import tarfile
    root = os.path.realpath(dest)
    for m in tar:
        name = m.name.lstrip("/" + os.sep)
        target = os.path.realpath(os.path.join(root, name))
        if not _inside(root, target):
            raise tarfile.TarError("%r would extract outside the destination" % m.name)
        if m.issym():
            if os.path.isabs(m.linkname):
                raise tarfile.TarError("%r links to an absolute path" % m.name)
            if not _inside(root, os.path.realpath(os.path.join(os.path.dirname(target), m.linkname))):
                raise tarfile.TarError("%r links outside the destination" % m.name)
        elif m.islnk():
            if not _inside(root, os.path.realpath(os.path.join(root, m.linkname.lstrip("/")))):
                raise tarfile.TarError("%r links outside the destination" % m.name)
        elif not (m.isreg() or m.isdir()):
            raise tarfile.TarError("%r is a special file" % m.name)
        m.name = name
        mode = m.mode & 0o755 if m.isdir() or m.isreg() else m.mode
        if m.isreg():
            mode |= 0o600
            if not mode & 0o100:
                mode &= ~0o011
        m.mode = mode
        m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
        yield m


def put_archive(dest: str, data: bytes) -> None:
    import tarfile  # here, not at start: execd's start is every sandbox's (slow under gVisor)

    try:
        os.makedirs(dest, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:
                tar.extractall(dest, members=_safe_members(tar, dest))
    except OSError as exc:
        raise _os_error(exc, dest) from None
    except tarfile.TarError as exc:
        raise RequestError("bad_archive", str(exc)) from None


def get_archive(path: str) -> bytes:
    import tarfile

    if not os.path.lexists(path):
        raise RequestError("not_found", "%s: No such file or directory" % path)
    buf = io.BytesIO()
    try:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(path, arcname=os.path.basename(path.rstrip("/")) or ".")
    except OSError as exc:
        raise _os_error(exc, path) from None
    return buf.getvalue()


# ----------------------------------------------------------------------------- reset


def _kill_all_but(keep: set) -> None:
    """SIGKILL every process but `keep`, pass after pass until one finds nothing (a fork
    bomb forks between passes; eight passes were not always enough under load), for at
    most 10 s."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        killed = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in keep:
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
                os.kill(int(name), signal.SIGKILL)
                killed += 1
            except (OSError, IndexError):
                continue
        if not killed:
            return


def _empty(d: str) -> None:
    """Remove everything in `d` (kept itself), whatever modes the sandbox's code left."""
    try:
        entries = os.listdir(d)
    except FileNotFoundError:
        return
    except PermissionError:
        os.chmod(d, stat.S_IMODE(os.stat(d).st_mode) | 0o700)
        entries = os.listdir(d)
    if not entries:
        return
    for root, dirs, _ in os.walk(d):  # top-down: each directory opened up before it is entered
        for x in dirs:
            p = os.path.join(root, x)
            try:
                st = os.lstat(p)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(p, stat.S_IMODE(st.st_mode) | 0o700)
            except OSError:
                pass
    for x in entries:
        p = os.path.join(d, x)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RequestError("reset_failed", "cannot empty %s: %s" % (d, exc)) from None
    left = os.listdir(d)
    if left:
        raise RequestError("reset_failed", "cannot empty %s: %s" % (d, os.path.join(d, left[0])))


def reset(dirs: List[str], workdir: Optional[str]) -> None:
    """What a reused sandbox needs between users, without starting a process: every process
    but init, execd and the warm interpreter (warm_python.py) killed, `dirs` emptied, the workdir (when it is ours) mode 0755."""
    _kill_all_but({1, os.getpid(), WARM.pid() or 1})
    WARM.after_reset()
    for d in dirs:
        _empty(d)
    if workdir:
        try:
            if os.stat(workdir).st_uid == os.getuid():
                os.chmod(workdir, 0o755)
        except OSError:
            pass


# ----------------------------------------------------------------------------- requests


def _exec_args(h: Dict[str, Any], blobs: List[bytes]) -> Dict[str, Any]:
    idx = h.get("stdin")
    stdin = blobs[idx] if isinstance(idx, int) and 0 <= idx < len(blobs) else None
    timeout = float(h["timeout"]) if h.get("timeout") is not None else 60.0
    limit = int(h["output_limit"]) if h.get("output_limit") is not None else (1 << 20)
    if timeout <= 0 or limit < 0:
        raise RequestError("bad_request", "timeout must be > 0 and output_limit >= 0")
    return {
        "env": h.get("env"),
        "cwd": h.get("cwd"),
        "stdin": stdin,
        "timeout": timeout,
        "limit": limit,
    }


def _parallelism() -> int:
    """CPUs this sandbox may use: the affinity mask, bounded by a cgroup CPU quota."""
    try:
        n = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        n = os.cpu_count() or 1
    quota = None
    try:  # cgroup v2: "max 100000" or "150000 100000"
        with open("/sys/fs/cgroup/cpu.max") as f:
            q, period = f.read().split()[:2]
            if q != "max":
                quota = int(q) / int(period)
    except (OSError, ValueError):
        try:  # cgroup v1
            with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
                q1 = int(f.read())
            with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                p1 = int(f.read())
            if q1 > 0 and p1 > 0:
                quota = q1 / p1
        except (OSError, ValueError):
            pass
    if quota is not None:
        n = min(n, max(1, int(-(-quota // 1))))  # ceil
    return n


def handle_batch(conn: socket.socket, h: Dict[str, Any], blobs: List[bytes]) -> None:
    jobs = h.get("jobs")
    if not isinstance(jobs, list):
        raise RequestError("bad_request", "jobs must be a list")
    parsed = [(j.get("argv"), _exec_args(j, blobs)) for j in jobs]
    parallel = int(h.get("parallel") or _parallelism())
    results: List[Any] = [None] * len(parsed)
    # The workers watch cancel_r; it becomes readable when the client hangs up.
    cancel_r, cancel_w = os.pipe()
    done_r, done_w = os.pipe()
    remaining = [len(parsed)]
    lock = threading.Lock()
    cancelled = threading.Event()

    def work(i: int) -> None:
        argv, kw = parsed[i]
        try:
            if cancelled.is_set():
                raise RequestError("cancelled", "the client went away")
            results[i] = run_command(argv, cancel_fd=cancel_r, **kw)
        except RequestError as exc:
            results[i] = ({"error": {"code": exc.code, "message": str(exc)}}, b"", b"")
        except Exception as exc:  # one job's bug must not lose the others
            results[i] = ({"error": {"code": "internal", "message": repr(exc)}}, b"", b"")
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                os.write(done_w, b"x")

    try:
        if parsed:
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(parsed))))
            for i in range(len(parsed)):
                pool.submit(work, i)
            with selectors.DefaultSelector() as sel:
                sel.register(done_r, selectors.EVENT_READ, "done")
                sel.register(conn, selectors.EVENT_READ, "conn")
                finished = False
                while not finished:
                    for key, _ in sel.select():
                        if key.data == "done":
                            finished = True
                        else:  # client gone: stop every job, then drop the reply
                            cancelled.set()
                            os.write(cancel_w, b"x")
                            sel.unregister(conn)
            pool.shutdown(wait=True)
    finally:
        for fd in (cancel_r, cancel_w, done_r, done_w):
            os.close(fd)
    out_blobs: List[bytes] = []
    fields = []
    for res, so, se in results:
        fields.append(res)
        out_blobs += [so, se]
    send_frame(conn, {"ok": True, "results": fields}, out_blobs)


def handle(conn: socket.socket, h: Dict[str, Any], blobs: List[bytes], deadline: Optional[float]) -> None:
    op = h.get("op")
    if op == "ping":
        send_frame(
            conn,
            {
                "ok": True,
                "protocol": PROTOCOL,
                "pid": os.getpid(),
                "uid": os.getuid(),
                "python": sys.version.split()[0],
                "cpus": _parallelism(),
                "ttl_left_s": None if deadline is None else round(deadline - time.monotonic(), 3),
            },
        )
    elif op == "exec":
        on_output: Optional[Callable[[str, bytes], None]] = None
        if h.get("stream"):

            def stream_output(stream: str, data: bytes) -> None:
                send_frame(conn, {"event": "output", "stream": stream}, [data])

            on_output = stream_output
        res, so, se = run_command(h.get("argv") or [], cancel_fd=conn.fileno(), on_output=on_output, **_exec_args(h, blobs))
        send_frame(conn, {"ok": True, "result": res}, [so, se])
    elif op == "python":
        kw = _exec_args(h, blobs)
        source = kw.pop("stdin") or b""
        cpu = h.get("cpu_limit_s")
        res, so, se = run_python(source, cpu_limit_s=int(cpu) if cpu else None, cancel_fd=conn.fileno(), **kw)
        send_frame(conn, {"ok": True, "result": res}, [so, se])
    elif op == "batch_exec":
        handle_batch(conn, h, blobs)
    elif op == "live":
        run_live(conn, h)
    elif op == "attach":
        attach_live(conn, h)
    elif op == "reset":
        dirs = h.get("dirs")
        if not isinstance(dirs, list) or not all(isinstance(d, str) and d.startswith("/") for d in dirs):
            raise RequestError("bad_request", "dirs must be a list of absolute paths")
        reset(dirs, h.get("workdir"))
        send_frame(conn, {"ok": True})
    elif op == "signal":
        send_frame(conn, {"ok": True, "delivered": signal_live(int(h.get("pid") or 0), int(h.get("signal") or 0))})
    elif op == "read_file":
        send_frame(conn, {"ok": True}, [read_file(_path(h))])
    elif op == "write_file":
        write_file(_path(h), blobs[0] if blobs else b"", int(h.get("mode", 0o644)))
        send_frame(conn, {"ok": True})
    elif op == "put_archive":
        put_archive(_path(h), blobs[0] if blobs else b"")
        send_frame(conn, {"ok": True})
    elif op == "get_archive":
        send_frame(conn, {"ok": True}, [get_archive(_path(h))])
    else:
        raise RequestError("bad_request", "unknown op %r" % (op,))


def _path(h: Dict[str, Any]) -> str:
    p = h.get("path")
    if not isinstance(p, str) or not p or "\x00" in p:
        raise RequestError("bad_request", "path must be a non-empty string")
    return p


def serve_connection(conn: socket.socket, deadline: Optional[float]) -> None:
    rfile = conn.makefile("rb")
    try:
        while True:
            try:
                frame = recv_frame(rfile)
            except (EOFError, ValueError, RequestError, OSError):
                return  # garbage or a dead peer: drop the connection
            if frame is None:
                return
            header, blobs = frame
            try:
                handle(conn, header, blobs, deadline)
            except RequestError as exc:
                send_frame(conn, {"ok": False, "error": {"code": exc.code, "message": str(exc)}})
            except (BrokenPipeError, ConnectionResetError):
                return
            except Exception as exc:  # report, keep serving
                send_frame(conn, {"ok": False, "error": {"code": "internal", "message": repr(exc)}})
            if header.get("op") in ("live", "attach"):
                return  # a live process's connection carries nothing after it
    except OSError:
        return
    finally:
        rfile.close()
        conn.close()


# ----------------------------------------------------------------------------- main


def _listen(path: str) -> Tuple[socket.socket, Tuple[int, int]]:
    """Bind under a temporary name, open it up, then rename into place: the socket path
    appearing means execd is accepting."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(tmp)
    os.chmod(tmp, 0o777)  # host-side clients run as another uid
    sock.listen(256)
    os.replace(tmp, path)
    st = os.stat(path)
    return sock, (st.st_dev, st.st_ino)


def _unlink_if_ours(path: str, ident: Tuple[int, int]) -> None:
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) == ident and stat.S_ISSOCK(st.st_mode):
            os.unlink(path)
    except OSError:
        pass


def _not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: commands run under execd's uid, and this keeps them from
    ptrace-attaching to it or writing its /proc/PID/mem (execd reports their results)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def _start_egress_relay(port: int, uds_path: str) -> None:
    """Load egress_relay.py from this file's folder (-I keeps it off sys.path) and start it."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "egress_relay.py")
    spec = importlib.util.spec_from_file_location("sandgym_egress_relay", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.start(port, uds_path)


def watch_owner(path: str, grace: float) -> None:
    """The owner's lifeline (run in its own thread): block reading the FIFO until no writer
    is left, i.e. the owning process on the host is gone, however it died; then after
    `grace` seconds stop execd as SIGTERM would (the container ends with it). A FIFO that
    cannot be opened leaves only the TTL, said on stderr."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, even with no writer
        os.set_blocking(fd, True)
        while os.read(fd, 4096):  # nobody writes; EOF once the last writer is gone
            pass
    except OSError as exc:
        sys.stderr.write("sandgym-execd: owner lifeline %s unusable (%s); only the TTL ends this sandbox\n" % (path, exc))
        return
    time.sleep(grace)
    # To the main thread, so its accept() is interrupted and it shuts down as on SIGTERM.
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)


def serve(
    sock: socket.socket, ident: Tuple[int, int], args: argparse.Namespace, deadline: Optional[float], supervised: bool
) -> None:
    """Accept and serve connections until the TTL, SIGTERM/SIGINT or the owner's lifeline
    ends execd; then kill what it started and exit 0. Supervised (a child of `init`), the
    socket is init's: it stays in place for the next execd."""

    def stop(signum: int, frame: Any) -> None:
        raise _Stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if supervised:
        _prefer_for_oom(os.getpid(), 100)  # an OOM kill takes this execd (init starts another), not init
    FORK_SCORE.probe()  # before _not_dumpable: see _ForkScore

    _not_dumpable()
    if args.egress_port and args.egress_socket:
        _start_egress_relay(args.egress_port, args.egress_socket)
    try:
        if args.owner_fifo:  # inside the try: its SIGTERM may come at once
            threading.Thread(
                target=watch_owner, args=(args.owner_fifo, max(0.0, args.owner_grace)), name="owner", daemon=True
            ).start()
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                continue
            conn.setblocking(True)
            try:
                threading.Thread(target=serve_connection, args=(conn, deadline), daemon=True).start()
            except RuntimeError:  # no thread to be had (the pids limit is full): refuse this one
                _refuse(conn)
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not supervised:
            _unlink_if_ours(args.socket, ident)
            sock.close()
        REGISTRY.kill_all()
        WARM.kill()
    # Exit now: worker threads blocked on dead commands or dead clients need no goodbye.
    sys.stdout.flush()
    os._exit(0)


def _refuse(conn: socket.socket) -> None:
    """Answer a connection we cannot serve without reading its request, so the client
    knows the request never ran (and may send it again)."""
    try:
        conn.settimeout(1.0)
        send_frame(conn, {"ok": False, "error": {"code": "busy", "message": "execd has no thread to be had (is the pids limit reached?)"}})
    except OSError:
        pass
    conn.close()


# Restarts of a killed execd allowed within _RESTART_WINDOW_S before init gives up (a crash
# loop, e.g. no memory left for python to start, ends the sandbox instead of spinning).
_MAX_RESTARTS = 10
_RESTART_WINDOW_S = 30.0
_STOP_GRACE_S = 10.0  # after SIGTERM, how long execd gets to kill its commands and exit


def _spawn_serve(sock: socket.socket, ident: Tuple[int, int], args: argparse.Namespace, deadline: Optional[float]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            serve(sock, ident, args, deadline, supervised=True)
        finally:
            os._exit(1)
    return pid


def init(args: argparse.Namespace, deadline: Optional[float]) -> None:
    """execd as the container's PID 1 (no docker-init): hold the listening socket, run the
    serving execd in a child, and start it again whenever it dies without having been told
    to stop -- SIGKILLed from inside the sandbox, by the OOM killer or from the host -- so
    the sandbox, its files and its other processes outlive the kill. Clients that connect
    meanwhile wait in the socket's backlog. The kernel delivers no signal to a namespace's
    init from inside it unless init handles it, so code in the sandbox cannot kill this
    process; SIGTERM/SIGINT sent from inside are ignored too (a sender outside the container,
    `docker stop`, has no pid in it). The child exiting 0 (TTL, owner gone, stop) ends the
    container. Also reaps every orphan, as init must."""
    signals = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    sock, ident = _listen(args.socket)
    child: Optional[int] = None
    start_at: Optional[float] = time.monotonic()  # when to start the serving execd (again)
    starts: List[float] = []
    stop_by: Optional[float] = None  # once stopping: when the child gets SIGKILL
    code = 0
    while True:
        now = time.monotonic()
        if child is None and stop_by is None and start_at is not None and now >= start_at:
            starts = [t for t in starts if now - t < _RESTART_WINDOW_S] + [now]
            if len(starts) > _MAX_RESTARTS + 1:
                sys.stderr.write("sandgym-execd: execd started %d times in %.0fs; giving up\n" % (len(starts), _RESTART_WINDOW_S))
                code = 1
                break
            try:
                child, start_at = _spawn_serve(sock, ident, args, deadline), None
            except OSError as exc:  # no pid to be had (the pids limit is full): shortly again
                sys.stderr.write("sandgym-execd: cannot start execd: %s\n" % exc)
                start_at = now + 0.5
        wake = [t for t in (stop_by, start_at) if t is not None]
        info: Optional[signal.struct_siginfo]
        if wake:
            info = signal.sigtimedwait(signals, max(0.01, min(wake) - now))
        else:
            info = signal.sigwaitinfo(signals)
        if stop_by is not None and time.monotonic() >= stop_by and child is not None:
            os.kill(child, signal.SIGKILL)
        if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
            if info.si_pid != 0:
                sys.stderr.write("sandgym-execd: ignored signal %d from pid %d in the sandbox\n" % (info.si_signo, info.si_pid))
            elif stop_by is None:
                stop_by = time.monotonic() + _STOP_GRACE_S
                if child is not None:
                    os.kill(child, signal.SIGTERM)
        while True:  # reap: the child, and orphans handed to init
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid != child:
                continue
            child = None
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                stop_by = stop_by or time.monotonic()  # it ended itself: TTL, owner gone, stop
            elif stop_by is None:
                how = ("killed by signal %d" % os.WTERMSIG(status)) if os.WIFSIGNALED(status) else (
                    "exited with code %d" % os.WEXITSTATUS(status))
                sys.stderr.write("sandgym-execd: execd (pid %d) %s; starting it again\n" % (pid, how))
                start_at = time.monotonic()
        if stop_by is not None and child is None:
            break
    _unlink_if_ours(args.socket, ident)
    sys.stderr.flush()
    os._exit(code)  # as init: the kernel kills whatever is left in the container


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="sandgym execd: the in-sandbox exec daemon")
    ap.add_argument("--socket", required=True, help="unix socket path to listen on")
    ap.add_argument("--ttl", type=float, default=None, help="exit after this many seconds")
    ap.add_argument("--egress-port", type=int, default=None, help="relay 127.0.0.1:PORT ...")
    ap.add_argument("--egress-socket", default=None, help="... to this unix socket (egress_relay.py)")
    ap.add_argument("--owner-fifo", default=None, help="exit once this FIFO has no writer left")
    ap.add_argument("--owner-grace", type=float, default=0.0, help="... after this many seconds")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.ttl if args.ttl and args.ttl > 0 else None
    if os.getpid() == 1:
        init(args, deadline)
    sock, ident = _listen(args.socket)
    serve(sock, ident, args, deadline, supervised=False)


if __name__ == "__main__":
    main()
