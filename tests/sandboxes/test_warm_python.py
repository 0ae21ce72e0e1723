"""exec_python through execd's warm interpreter (execd/warm_python.py), in real sandboxes of
the Docker engine: a program is forked from it and behaves as `python3 -` would; what it
does to its parent (kill it, stop it) costs it its own verdict and nothing of the next
user's; reset keeps the interpreter and kills the programs' leftovers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from sandgym.sandboxes import SandboxSpec
from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.providers.docker import DockerProvider
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

SPEC = SandboxSpec(cpu=1.0, memory_mb=512, disk_mb=64, ttl_s=600)
# The program's parent: the warm interpreter when it was forked from it.
PARENT = "import os; print(open('/proc/%d/cmdline' % os.getppid()).read().replace(chr(0), ' '))"


@pytest.fixture
async def sb() -> AsyncIterator[Sandbox]:
    require("docker")
    provider = DockerProvider()
    box = await provider.create(SPEC, {"sandgym.owner": "test-warm-python"})
    try:
        yield box
    finally:
        await box.close()
        await provider.aclose()


async def _pid(sb: Sandbox) -> str:
    """The pid of the program's parent (the warm interpreter)."""
    r = await sb.exec_python("import os; print(os.getppid())")
    assert r.exit_code == 0, r.stderr
    return r.stdout.strip()


async def _parent(sb: Sandbox) -> str:
    r = await sb.exec_python(PARENT)
    assert r.exit_code == 0, r.stderr
    return r.stdout


async def test_a_program_is_forked_and_runs_as_python3_dash_would(sb: Sandbox) -> None:
    assert "warm_python" in await _parent(sb)
    prog = (
        "import os, sys\n"
        "print(sys.argv, sys.path[0] == '', os.environ['X'], os.getcwd(), sys.stdin.read() == '', __name__)\n"
        "print(sys.dont_write_bytecode, os.getpgid(0) == os.getpid())\n"
        "sys.exit('a message')\n"
    )
    r = await sb.exec_python(prog, env={"X": "y"}, cwd="/tmp")
    assert (r.exit_code, r.stderr) == (1, "a message\n")
    # The image sets PYTHONDONTWRITEBYTECODE: the child honours it as a fresh interpreter would.
    assert r.stdout == "['-'] True y /tmp True __main__\nTrue True\n"
    tb = await sb.exec_python("import json\ndef f():\n    json.loads('{')\nf()\n")
    assert tb.exit_code == 1 and "warm_python" not in tb.stderr, tb.stderr
    assert tb.stderr.startswith('Traceback (most recent call last):\n  File "<stdin>", line 4, in <module>\n')
    assert tb.stderr.splitlines()[-1].startswith("json.decoder.JSONDecodeError")
    syntax = await sb.exec_python("def (:\n")
    assert syntax.exit_code == 1 and syntax.stderr.startswith('  File "<stdin>", line 1'), syntax.stderr
    # Its exit is the interpreter's: threads joined, atexit run, an unclosed file flushed.
    r = await sb.exec_python(
        "import atexit, threading, time\n"
        "f = open('/tmp/unclosed', 'w'); f.write('kept')\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\n"
        "atexit.register(print, 'atexit')\n"
    )
    assert (r.exit_code, r.stdout) == (0, "thread\natexit\n"), r.stderr
    assert (await sb.read_file("/tmp/unclosed")) == b"kept"
    # What the interpreter imported for itself is not there: a file in the working directory
    # shadows the standard library as in a fresh interpreter; __builtins__ is the module.
    await sb.write_file("/tmp/json.py", "WHO = 'the local json.py'\n")
    r = await sb.exec_python("import json, os; print(json.WHO, type(__builtins__).__name__, os.getsid(0) == os.getpid())", cwd="/tmp")
    assert (r.exit_code, r.stdout) == (0, "the local json.py module True\n"), r
    # An uncaught KeyboardInterrupt ends it by SIGINT, as python3 ends.
    r = await sb.exec_python("raise KeyboardInterrupt")
    assert r.exit_code == 130 and not r.timed_out and r.stderr.rstrip().endswith("KeyboardInterrupt"), r
    # Each child draws its own random state.
    draws = {(await sb.exec_python("import random; print(random.random())")).stdout for _ in range(3)}
    assert len(draws) == 3


async def test_limits_timeouts_and_a_fresh_interpreter_where_warm_would_differ(sb: Sandbox) -> None:
    loop = await sb.exec_python("while True:\n    pass\n", cpu_limit_s=1, timeout=30)
    assert loop.exit_code == 137 and not loop.timed_out, loop
    slow = await sb.exec_python("import time; time.sleep(60)", timeout=1)
    assert slow.timed_out and slow.exit_code == 124
    assert (await sb.exec(["pgrep", "-f", "time.sleep"])).exit_code == 1  # killed, not left behind
    missing = await sb.exec_python("print(1)", cwd="/nowhere")
    assert missing.exit_code == 126 and "/nowhere" in missing.stderr
    # PYTHONPATH is read at an interpreter's start: such a program gets a fresh one.
    await sb.write_file("/tmp/lib/mod.py", "X = 'from PYTHONPATH'\n")
    r = await sb.exec_python("import mod, os, sys; print(mod.X, sys.flags.isolated, os.getppid() != %s)" % (await _pid(sb)),
                             env={"PYTHONPATH": "/tmp/lib"})
    assert (r.exit_code, r.stdout) == (0, "from PYTHONPATH 0 True\n"), r


async def test_a_program_that_kills_or_stops_its_parent_loses_only_itself(sb: Sandbox) -> None:
    first = await _pid(sb)
    killed = await sb.exec_python("import os, signal, time; os.kill(os.getppid(), signal.SIGKILL); time.sleep(0.2)")
    assert killed.exit_code == 255 and "warm interpreter that ran this program died" in killed.stderr, killed
    second = await _pid(sb)  # a new one, for the next program
    assert second != first and "warm_python" in await _parent(sb)
    # Stopped, it cannot report its child's exit: execd gives up on it after a few seconds.
    stopped = await sb.exec_python("import os, signal; os.kill(os.getppid(), signal.SIGSTOP)", timeout=30)
    assert stopped.exit_code == 255 and "died" in stopped.stderr, stopped
    # Stopped by anything else, reset kills it: the next user's programs would hang.
    await sb.exec_python("print('start one')")
    assert (await sb.exec(["pkill", "-STOP", "-f", "warm_python.main"])).exit_code == 0
    assert await sb.reset()
    r = await sb.exec_python("print('next user')", timeout=20)
    assert (r.exit_code, r.stdout) == (0, "next user\n"), r


async def test_reset_keeps_the_interpreter_and_kills_what_programs_left(sb: Sandbox) -> None:
    pid = await _pid(sb)
    left = await sb.exec_python("import subprocess; subprocess.Popen(['setsid', 'sleep', '391']); print('ok')")
    assert left.stdout == "ok\n"
    assert await sb.reset()
    assert (await sb.exec(["pgrep", "-f", "sleep 391"])).exit_code == 1
    assert await _pid(sb) == pid


async def test_the_interpreter_starts_only_while_no_user_process_runs(sb: Sandbox) -> None:
    """A process of the sandbox user could reach it while it starts (before it is not
    dumpable): it starts only when none runs, else programs get a fresh interpreter until
    the reset that ends that process."""
    assert (await sb.exec("setsid sleep 393 >/dev/null 2>&1 < /dev/null &")).exit_code == 0
    assert "warm_python" not in await _parent(sb)
    assert await sb.reset()
    assert "warm_python" in await _parent(sb)


async def test_no_program_enters_the_interpreters_memory(sb: Sandbox) -> None:
    """Each child inherits the interpreter's memory: a program's source (another user's tests)
    must never pass through it. Read it from the host (root may read any process)."""
    marker = "never-in-the-parent-" + uuid.uuid4().hex
    r = await sb.exec_python(f"import os\nx = {marker!r}\nprint(os.getppid(), open('/proc/%d/cmdline' % os.getppid()).read())")
    assert r.exit_code == 0 and "warm_python" in r.stdout, (r, (await sb.exec(["ps", "-eo", "pid,ppid,stat,args"])).stdout)
    import docker

    inside = r.stdout.split()[0]  # its pid in the sandbox; the host knows it by another
    top = docker.from_env().api.top(sb.id, ps_args="-o pid")["Processes"]
    host_pid = next((int(p[0]) for p in top if _ns_pid(int(p[0])) == inside), None)
    assert host_pid is not None, (inside, top)
    assert not _memory_holds(host_pid, marker.encode()), "the program's source is in the warm interpreter's memory"


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable mapping of process `pid` holds `needle` (read as root)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            lo, hi = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(lo)
                if needle in mem.read(hi - lo):
                    return True
            except (OSError, OverflowError, ValueError):
                continue
    return False


def _ns_pid(host_pid: int) -> str:
    """A host process's pid in its own (the sandbox's) pid namespace."""
    with open(f"/proc/{host_pid}/status") as f:
        return next(line.split()[-1] for line in f if line.startswith("NSpid:"))
