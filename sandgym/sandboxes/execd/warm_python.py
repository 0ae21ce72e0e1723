"""The warm interpreter: a `python3 -I` that execd (daemon.py) keeps per sandbox and that
forks a child per Python program ("python" op), so a program costs a fork instead of an
interpreter start (10-17 ms of CPU per program under a 2-core host's load; HumanEval runs
one per rollout). Standard library only, Python >= 3.9, loaded from execd's folder.

Protocol (one socket pair with execd; framing.py frames): the interpreter says {"ready"}
once it is not dumpable; then per program execd sends {"id"} with three pipe ends attached
(SCM_RIGHTS): the job's body to read (a frame {"env", "cwd", "cpu_limit_s"} with the
program as its blob), the child's stdout and stderr. The interpreter forks, replies
{"id", "pid"}, and when the child ends {"pid", "status"} (a wait status). Only the child
reads the body: no program's source or environment ever enters the interpreter's memory,
which every later child inherits. When execd hangs up it kills its children and exits.

The child runs the program as `python3 -` would: `__main__` a fresh module, sys.argv
["-"], '' first on sys.path, no module imported beyond what the interpreter's own start
imported (so a file in the working directory shadows the standard library as it would),
the job's whole environment in os.environ, stdin at end of file (the program came on it),
a session of its own, RLIMIT_CPU when asked. Why that is safe across users: the
interpreter was started isolated (-I: no PYTHON* variables, no user site-packages, nothing
from the working directory) and only when no process of a sandbox user ran (daemon.py),
so nothing a sandbox user writes can enter it, and it survives `reset` holding only the
standard library. execd starts a fresh `python3 -` instead where a child would differ
(daemon.py's WarmPython.fits). Children share the interpreter's str-hash seed (a fresh
interpreter draws one per run). The interpreter is not dumpable (no process of the same
user may ptrace it or open its descriptors); its children are again, like any program.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import io
import os
import resource
import selectors
import signal
import socket
import sys
import types
from typing import Any, Dict, List, Optional, Set, Tuple

from framing import read_frame, recv_frame_fds, send_frame  # type: ignore[import-not-found]  # execd's folder, put on sys.path by execd

MAX_FDS = 3  # a job's body, stdout and stderr
SETUP_EXIT = 126  # the child could not set itself up (a missing cwd): as a shell says "cannot run"


def _nondumpable(flag: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, flag, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:
        pass


def recv(sock: socket.socket) -> Tuple[Optional[Dict[str, Any]], List[int]]:
    """The next job and the descriptors that came with it (None: execd hung up)."""
    try:
        frame, fds = recv_frame_fds(sock, MAX_FDS)
    except (EOFError, OSError, ValueError):
        frame, fds = None, []
    if frame is None or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None, []
    return frame[0], fds


def serve(sock: socket.socket) -> Optional[List[int]]:
    """Fork a child per job until execd hangs up (then None). Returns in a child only: its
    body, stdout and stderr descriptors."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd does the work
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "job")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    children: set = set()
    send_frame(sock, {"ready": True})
    while True:
        for key, _ in sel.select():
            if key.data == "child":
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                while children:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    children.discard(pid)
                    send_frame(sock, {"pid": pid, "status": status})
                continue
            job, fds = recv(sock)
            if job is None:
                for pid in children:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                return None
            pid = os.fork()
            if pid == 0:
                os.setsid()  # its own session and group, as execd's commands have
                sel.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w):
                    os.close(fd)
                sock.close()
                return fds
            for fd in fds:
                os.close(fd)
            children.add(pid)
            send_frame(sock, {"id": job.get("id"), "pid": pid})


def read_body(fd: int) -> Tuple[Dict[str, Any], bytes]:
    """The job's environment, working directory and CPU limit, and the program."""
    with os.fdopen(fd, "rb") as f:
        frame = read_frame(f.read)
    if frame is None:
        os._exit(SETUP_EXIT)
    return frame[0], frame[1][0] if frame[1] else b""


def become_program(job: Dict[str, Any], fds: List[int], base: Set[str]) -> None:
    """In the child: the process `python3 -` would have been, but for the program itself."""
    null = os.open(os.devnull, os.O_RDONLY)
    for target, fd in zip((0, 1, 2), [null, *fds]):
        os.dup2(fd, target)
    for fd in {null, *fds}:
        if fd > 2:
            os.close(fd)
    _nondumpable(1)
    env = job.get("env") or {}
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    cwd = job.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            os.write(2, ("sandgym-execd: cannot run 'python3' in %r: %s\n" % (cwd, exc)).encode())
            os._exit(SETUP_EXIT)
    # The two PYTHON* variables with a runtime equivalent (images set them, sandgym/python
    # too); execd sends jobs with any other PYTHON* variable to a fresh interpreter.
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    if env.get("PYTHONUNBUFFERED"):
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            raw = io.FileIO(fd, "w", closefd=False)
            setattr(sys, name, io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True))
    cpu = job.get("cpu_limit_s")
    if cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu)))
    sys.argv[:] = ["-"]
    sys.path[:] = ["", *(p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__)))]
    for name in list(sys.modules):
        if name not in base:  # what this file imported: a program imports its own, from its sys.path
            del sys.modules[name]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main


def run(source: bytes) -> int:
    """Run the program in the fresh `__main__`; its exit code (-SIGINT for an uncaught
    KeyboardInterrupt). An uncaught exception is printed (without this frame) and is 1;
    SystemExit says its code as the interpreter reads it."""
    main = sys.modules["__main__"]
    try:
        code = compile(source, "<stdin>", "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def finish(code: int) -> None:
    """The interpreter's exit as a program sees it (non-daemon threads joined, atexit
    handlers, its objects finalized, streams flushed), without tearing down what the warm
    interpreter had loaded: that cost 10-18 ms per program, mostly copying the pages it
    shares with its parent."""
    try:
        threading = sys.modules.get("threading")
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()  # prints what a handler raises (and re-raises it before 3.11)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        pass
    try:
        sys.modules["__main__"].__dict__.clear()  # e.g. a file it never closed gets flushed
        gc.collect()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = 120  # as the interpreter exits when it cannot flush its streams
    if code == -signal.SIGINT:  # as the interpreter ends on an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    os._exit(code)


def main(base: Set[str]) -> None:
    """`base`: the modules the interpreter had before this file was imported."""
    _nondumpable(0)
    sock = socket.socket(fileno=int(sys.argv[1]))
    gc.freeze()  # what is loaded now is never collected in a child: its pages stay shared
    fds = serve(sock)
    if fds is None:
        return
    del sock
    job, source = read_body(fds[0])
    become_program(job, fds[1:], base)
    del job, fds
    finish(run(source))
