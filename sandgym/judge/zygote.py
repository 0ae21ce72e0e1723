"""The judge's fork server (the "zygote"), run in the sandbox by the harness
(sandbox_harness.py) as its own `python3 -I -c` program (program.py) with one end of a
socket pair as its argument. Standard library only (any python3 >= 3.9 image).

It holds only the compiled solution: the harness sends the code first ({"code", "kind",
"fn_name"}; the reply is {"ok": true} or {"ok": false, "error"} for a compile error); then,
per test, a job ({"memory_mb", "cpu_limit_s", "token"}) with the child's four pipe ends
attached (SCM_RIGHTS: stdin, stdout, stderr, result). It forks a child that sets its limits
(RLIMIT_AS for memory, RLIMIT_CPU, no core files) and runs the solution, replies {"pid"},
waits for the child and replies {"status", "maxrss_kb", "cpu_s"}. Messages are
sandgym.sandboxes.execd.framing frames.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import resource
import signal
import socket
import sys
import traceback
from typing import Any

from sandgym.sandboxes.execd.framing import recv_frame_fds, send_frame

MLE_EXIT = 121  # the child's exit code for MemoryError
SETUP_EXIT = 120  # the child could not set itself up (limits, descriptors)
MAX_FDS = 8


def nondumpable() -> None:
    """PR_SET_DUMPABLE 0: no other process of the same user may ptrace this one or open its
    memory and descriptors through /proc."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


def recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the descriptors that came with it ((None, []): the harness
    hung up)."""
    try:
        frame, fds = recv_frame_fds(sock, MAX_FDS)
    except EOFError:
        frame, fds = None, []
    if frame is None:
        return None, []
    return frame[0], fds


def vsz_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return 0


class Solution:
    """The compiled solution and how it is called."""

    def __init__(self, code: Any, kind: str, fn_name: str | None) -> None:
        self.code, self.kind, self.fn_name = code, kind, fn_name
        self.base_vsz = vsz_bytes()

    def run_child(self, job: dict[str, Any], fds: list[int]) -> None:
        """In the forked child: set limits, run the solution, exit with its status."""
        stdin_r, stdout_w, stderr_w, result_w = fds
        try:
            os.setsid()
            os.dup2(stdin_r, 0)
            os.dup2(stdout_w, 1)
            os.dup2(stderr_w, 2)
            os.closerange(3, result_w)
            os.closerange(result_w + 1, 65536)
            mem = self.base_vsz + job["memory_mb"] * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            cpu = int(job["cpu_limit_s"])
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
            sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), write_through=False)
            sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), write_through=True)
            sys.setrecursionlimit(max(sys.getrecursionlimit(), 100000))
            os.environ["SANDGYM_JUDGE_TEST"] = job["token"]  # inherited by what it starts
        except BaseException:
            os._exit(SETUP_EXIT)
        code = 0
        try:
            ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
            if self.kind == "stdin":
                exec(self.code, ns)
            else:
                args = json.loads(sys.stdin.read())
                exec(self.code, ns)
                sol = ns.get("Solution")
                fn_name = str(self.fn_name)
                fn = getattr(sol(), fn_name) if sol is not None and hasattr(sol, fn_name) else ns[fn_name]
                out = fn(*args)
                with os.fdopen(result_w, "w") as f:
                    f.write(json.dumps(out, default=lambda o: list(o) if isinstance(o, (set, tuple)) else repr(o)))
        except MemoryError:
            code = MLE_EXIT
        except SystemExit as e:
            code = 0 if e.code in (None, 0) else (e.code if isinstance(e.code, int) else 1)
        except BaseException:
            try:
                etype, value, tb = sys.exc_info()
                while tb is not None and tb.tb_frame.f_code.co_filename != "solution.py":
                    tb = tb.tb_next  # show the solution's frames only
                traceback.print_exception(etype, value, tb)
            except BaseException:
                pass
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except MemoryError:
            code = MLE_EXIT
        except BaseException:
            pass
        os._exit(code)


def serve(sock: socket.socket) -> None:
    req, _ = recv(sock)
    if req is None:
        return
    try:
        compiled = compile(req["code"], "solution.py", "exec")
    except BaseException:
        send_frame(sock, {"ok": False, "error": traceback.format_exc(limit=0)[-2000:]})
        return
    solution = Solution(compiled, req["kind"], req.get("fn_name"))
    del req
    send_frame(sock, {"ok": True})
    while True:
        job, fds = recv(sock)
        if job is None:
            break
        pid = os.fork()
        if pid == 0:
            solution.run_child(job, fds)
        for fd in fds:
            os.close(fd)
        send_frame(sock, {"pid": pid})
        _, status, ru = os.wait4(pid, 0)
        try:
            os.killpg(pid, signal.SIGKILL)  # what the child left behind
        except OSError:
            pass
        send_frame(sock, {"status": status, "maxrss_kb": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime})


def main() -> None:
    nondumpable()
    serve(socket.socket(fileno=int(sys.argv[1])))


if __name__ == "__main__":
    main()
