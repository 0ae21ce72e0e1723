"""The in-sandbox judge: run as `python3 -I -c <program.harness_program()>` with a JSON request
on stdin; prints one line `@@sandgym-judge@@ {json}` last. Standard library only (any python3
>= 3.9 image).

Two processes. The parent reads the request (code, tests, limits, and the fork server's
program), starts the fork server (the "zygote", zygote.py) that has only the compiled
solution in memory, and then, test by test: makes pipes, hands the child's ends to the
zygote (SCM_RIGHTS), which forks a child that sets its limits (RLIMIT_AS for memory,
RLIMIT_CPU, no core files) and runs the solution; the parent feeds stdin, reads stdout/stderr with a cap (endless output is killed: OLE), kills the
child's process group at the wall-clock limit (TLE), gets the exit status and resource use
from the zygote, and compares. A test costs one fork, not a new interpreter, and a problem
costs one exec, not one per test.

What a solution can reach: its own test's input, the zygote's memory (the compiled code, no
answers), and processes of the same user. The parent (which holds the expected outputs) and
the zygote are made non-dumpable, so a child can neither read their memory nor open their
file descriptors through /proc; a child that kills the parent only ends the judging (JE).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable

from sandgym.judge.zygote import MLE_EXIT, nondumpable
from sandgym.sandboxes.execd.framing import encode, read_frame

MARK = "@@sandgym-judge@@ "
PIPE_BUF_SAFE = 60000  # a Linux pipe holds 64 KiB: smaller inputs are written without a thread


class Zygote:
    """The fork server (zygote.py) in a process of its own, started from `program` (its
    source, sent in the request: the sandbox has no sandgym) with the compiled solution."""

    def __init__(self, program: str, code: str, kind: str, fn_name: str | None) -> None:
        parent, child = socket.socketpair()
        self.sock = parent
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", program, str(child.fileno())],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        child.close()
        self.send({"code": code, "kind": kind, "fn_name": fn_name})
        self.hello = self.recv(timeout=60)

    def send(self, obj: dict[str, Any], fds: Iterable[int] = ()) -> None:
        socket.send_fds(self.sock, encode(obj), list(fds))

    def recv(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message (None: the fork server hung up)."""
        self.sock.settimeout(timeout)
        try:
            frame = read_frame(self.sock.recv)
        except EOFError:
            return None
        return None if frame is None else frame[0]

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait()


def _floats_equal(a: str | float, b: str | float, tol: float) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if x != x or y != y:  # NaN
        return False
    return abs(x - y) <= tol or abs(x - y) <= tol * max(abs(x), abs(y))


def compare_text(out: str, expected: str, mode: str, tol: float) -> bool:
    if mode == "exact":
        return out == expected
    if mode == "lines":
        a = [line.rstrip() for line in out.rstrip().split("\n")]
        b = [line.rstrip() for line in expected.rstrip().split("\n")]
        return a == b
    a, b = out.split(), expected.split()
    if mode == "whitespace":
        return a == b
    return len(a) == len(b) and all(_floats_equal(x, y, tol) for x, y in zip(a, b))


def _values_equal(a: Any, b: Any, tol: float, use_tol: bool) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if use_tol and isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return _floats_equal(a, b, tol)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_values_equal(x, y, tol, use_tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k], tol, use_tol) for k in a)
    return a == b


def compare_value(got_text: str, expected_text: str, mode: str, tol: float, unwrap: bool) -> bool:
    try:
        got = json.loads(got_text)
        expected = json.loads(expected_text)
    except ValueError:
        return got_text.strip() == expected_text.strip()
    use_tol = mode == "float"
    if _values_equal(got, expected, tol, use_tol):
        return True
    return bool(unwrap and isinstance(expected, list) and len(expected) == 1 and _values_equal(got, expected[0], tol, use_tol))


class Capture:
    """Reads a child's pipes until EOF. `limits[fd]` caps what is kept: past it a `head`
    stream is marked over (endless output), a `tail` stream keeps its last bytes."""

    def __init__(self, limits: dict[int, int], tails: Iterable[int]) -> None:
        self.bufs = {fd: bytearray() for fd in limits}
        self.limits = limits
        self.tails = set(tails)
        self.over: set[int] = set()
        self.sel = selectors.DefaultSelector()
        for fd in limits:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.open = set(limits)

    def read(self, fd: int) -> bool:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not data:
            self.sel.unregister(fd)
            self.open.discard(fd)
            return False
        buf = self.bufs[fd]
        buf += data
        if len(buf) > self.limits[fd]:
            if fd in self.tails:
                del buf[: len(buf) - self.limits[fd]]
            else:
                del buf[self.limits[fd] :]
                self.over.add(fd)
        return True

    def pump(self, timeout: float) -> bool:
        """Read what is ready within `timeout`; False when nothing was."""
        events = [key for key, _ in self.sel.select(timeout) if key.fd in self.open]
        for key in events:
            self.read(key.fd)
        return bool(events)

    def close(self) -> None:
        for fd in list(self.bufs):
            try:
                os.close(fd)
            except OSError:
                pass
        self.sel.close()


def _feed(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError:
        pass  # the child stopped reading
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


BASELINE_PIDS: set[int] = set()


def _pids() -> set[int]:
    return {int(n) for n in os.listdir("/proc") if n.isdigit()}


def _kill_marked(token: str) -> None:
    """Kill what a test left behind in another session: new processes carrying its token."""
    mark = f"SANDGYM_JUDGE_TEST={token}".encode()
    for name in _pids() - BASELINE_PIDS - {os.getpid()}:
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_test(
    zyg: Zygote, req: dict[str, Any], test: dict[str, Any], checker: Callable[[str, str, str], object] | None
) -> dict[str, Any]:
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    tl = float(req["time_limit_s"])
    wall_limit = tl * float(req.get("wall_factor", 2.0)) + 0.5
    job = {"memory_mb": req["memory_mb"], "cpu_limit_s": max(1, int(tl + 0.999)), "token": req["token"]}
    t0 = time.perf_counter()
    zyg.send(job, [stdin_r, out_w, err_w, res_w])
    for fd in (stdin_r, out_w, err_w, res_w):
        os.close(fd)
    hello = zyg.recv(timeout=30)
    if not hello or "pid" not in hello:
        for fd in (stdin_w, out_r, err_r, res_r):
            os.close(fd)
        return {"verdict": "JE", "detail": "the fork server did not start the test"}
    pid = hello["pid"]
    data = test["input"].encode()
    feeder = None
    if len(data) <= PIPE_BUF_SAFE:
        _feed(stdin_w, data)  # fits in the pipe: no reader needed yet
    else:
        feeder = threading.Thread(target=_feed, args=(stdin_w, data), daemon=True)
        feeder.start()
    out_cap = int(req["output_limit_bytes"])
    cap = Capture({out_r: out_cap, err_r: 8192, res_r: out_cap}, tails=[err_r])
    # The zygote's next message is the child's exit status: wait for it and the pipes at once
    # (a process the child left behind may hold the pipes open after the child is gone).
    cap.sel.register(zyg.sock, selectors.EVENT_READ)
    killed: str | None = None
    done: dict[str, Any] | None = None
    deadline = t0 + wall_limit
    while done is None:
        left = deadline - time.perf_counter()
        if left <= 0:
            killed = "time"
            break
        for key, _ in cap.sel.select(min(left, 0.5)):
            if key.fileobj is zyg.sock:
                cap.sel.unregister(zyg.sock)
                done = zyg.recv(timeout=30)
                if done is None:
                    done = {}
                break
            cap.read(key.fd)
        if cap.over:
            killed = "output"
            break
    if killed:
        _kill(pid)
        if done is None:
            cap.sel.unregister(zyg.sock)
            done = zyg.recv(timeout=30)
    wall = time.perf_counter() - t0
    # Drain what the child wrote; stop once nothing more comes (a leftover may hold a pipe).
    end = time.perf_counter() + 2
    while cap.open and time.perf_counter() < end:
        if not cap.pump(0.05):
            break
    _kill_marked(req["token"])
    out = bytes(cap.bufs[out_r]).decode("utf-8", "replace")
    err = bytes(cap.bufs[err_r]).decode("utf-8", "replace")
    res = bytes(cap.bufs[res_r]).decode("utf-8", "replace")
    cap.close()
    if feeder is not None:
        feeder.join(timeout=1)
    if not done:
        return {"verdict": "JE", "time_s": wall, "detail": "the fork server died"}
    status = done["status"]
    base = {"time_s": round(wall, 4), "cpu_s": round(done["cpu_s"], 4), "memory_kb": int(done["maxrss_kb"])}
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -sig
    if killed == "output" or cap.over:
        return {**base, "verdict": "OLE", "detail": f"more than {out_cap} bytes of output"}
    if killed == "time" or sig == signal.SIGXCPU or done["cpu_s"] > tl + 0.5:
        return {**base, "verdict": "TLE", "detail": f"limit {tl:g}s"}
    if code == MLE_EXIT or "MemoryError" in err:
        return {**base, "verdict": "MLE", "detail": f"limit {req['memory_mb']} MiB"}
    if sig == signal.SIGKILL:  # killed by nobody here: the sandbox's OOM killer
        return {**base, "verdict": "MLE", "detail": "killed (out of memory)"}
    if code != 0:
        return {**base, "verdict": "RE", "detail": (err[-1500:] or f"exit {code}")}
    if req["kind"] == "call":
        ok = compare_value(res, test["output"], req["compare"], req["float_tol"], req.get("unwrap_list_answer", False))
        shown = res
    elif checker is not None:
        try:
            ok = bool(checker(test["input"], out, test["output"]))
        except Exception as exc:
            return {**base, "verdict": "JE", "detail": f"checker failed: {exc!r}"}
        shown = out
    else:
        ok = compare_text(out, test["output"], req["compare"], req["float_tol"])
        shown = out
    if ok:
        return {**base, "verdict": "AC"}
    return {**base, "verdict": "WA", "detail": f"got {shown[:200]!r}, expected {test['output'][:200]!r}"}


def main() -> None:
    nondumpable()
    req = json.loads(sys.stdin.buffer.read())
    req["token"] = os.urandom(8).hex()
    tests = req["tests"]
    checker = None
    if req.get("checker"):
        ns: dict[str, Any] = {"__name__": "checker"}
        exec(compile(req["checker"], "checker.py", "exec"), ns)
        checker = ns["check"]
    t0 = time.perf_counter()
    zyg = Zygote(req["zygote"], req["code"], req["kind"], req.get("fn_name"))
    BASELINE_PIDS.update(_pids())
    results = []
    compile_error = ""
    try:
        if not zyg.hello or not zyg.hello.get("ok"):
            compile_error = (zyg.hello or {}).get("error", "the fork server did not start")
            results = [{"verdict": "CE", "detail": compile_error[-500:]}] + [{"verdict": "SKIP"}] * (len(tests) - 1)
        else:
            failed = False
            for test in tests:
                if failed and req.get("stop_on_first_failure", True):
                    results.append({"verdict": "SKIP"})
                    continue
                r = run_test(zyg, req, test, checker)
                results.append(r)
                failed = failed or r["verdict"] != "AC"
                if r["verdict"] == "JE":
                    zyg.close()
                    zyg = Zygote(req["zygote"], req["code"], req["kind"], req.get("fn_name"))
                    BASELINE_PIDS.add(zyg.proc.pid)
    finally:
        zyg.close()
    sys.stdout.write(MARK + json.dumps({"tests": results, "compile_error": compile_error, "wall_s": time.perf_counter() - t0}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
