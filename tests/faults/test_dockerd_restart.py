"""The Docker engine restarted in the middle of a workload: a `sandgym eval` in a child
process, and sandboxes with acknowledged writes held by this one.

Opt-in (SANDGYM_FAULTS_DOCKERD=1, which .ci/run sets; root, a dockerd we can see):
restarting the engine touches every container on it, other users' included. The engine is
restarted with the exact argv it was started with (e.g. `dockerd --bridge=none
--iptables=false --ip6tables=false`), its output appended to the same log, and the test
makes sure an engine is running again whatever happens.

The engine runs with live-restore (the runtime installer turns it on): containers keep
running while dockerd is down, and a sandbox's commands and files go through execd's
socket, not dockerd. sandgym's containers are not `--rm` (Docker before 24.0.8, which
Debian 12 ships as 20.10, removes --rm containers when it comes back, moby/moby#46308), so
they survive the restart. Asserted: every held sandbox answers *during* and *after* the
restart with its writes (none lost); an execd killed while the engine is down is started
again by init, the exec that killed it reported interrupted; a create while the engine is
down fails with a typed error; after the restart new sandboxes come, with execd, and the
engine's events are followed again (a kill of a sandbox's init is REMOVED, not LOST, and its
container is removed); the eval exits 0 with one record per rollout, the rollouts the restart hit marked
as errors and counted, the others passed; nothing of either process is left once it has
finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from sandgym.sandboxes import SandboxManager, SandboxSpec
from sandgym.sandboxes.errors import SandboxError, SandboxGoneError
from sandgym.sandboxes.manager import ManagedSandbox
from tests.conftest import lacking, require
from tests.faults.test_execd_killed import KILL_EXECD, _init_host_pid, _interrupted, _kill_and_wait, _state

pytestmark = [pytest.mark.docker, pytest.mark.faults, pytest.mark.slow]

N, R = 6, 2
HELD = 3  # sandboxes with acknowledged writes held across the restart
DOCKERD_LOG = "/var/log/dockerd.log"
REPO = Path(__file__).resolve().parents[2]


def _dockerd() -> tuple[int, list[str]] | None:
    """The dockerd serving $DOCKER_HOST (default: /var/run/docker.sock) and its argv; None
    unless exactly one does (other engines on other sockets are left alone)."""
    want = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    default = want in ("unix:///var/run/docker.sock", "unix:///run/docker.sock")
    out = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True)
    found = []
    for pid in (int(p) for p in out.stdout.split()):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        hosts = [a.split("=", 1)[1] if "=" in a else argv[i + 1] for i, a in enumerate(argv)
                 if a.split("=", 1)[0] in ("-H", "--host") and ("=" in a or i + 1 < len(argv))]
        if want in hosts or (default and not hosts):
            found.append((pid, argv))
    return found[0] if len(found) == 1 else None


def _ping() -> bool:
    import docker

    try:
        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _engine_version() -> str:
    import docker

    client = docker.from_env(timeout=10)
    try:
        return str(client.version().get("Version"))
    finally:
        client.close()


def _live_restore() -> bool:
    import docker

    client = docker.from_env(timeout=10)
    try:
        return bool(client.info().get("LiveRestoreEnabled"))
    finally:
        client.close()


def _wait(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _start_dockerd(argv: list[str]) -> None:
    with open(DOCKERD_LOG, "ab") as log:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
    assert _wait(_ping, 120), f"dockerd did not come back; see {DOCKERD_LOG}"


def _containers(label: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": label})]
    finally:
        client.close()


class Restart:
    """dockerd stopped (SIGTERM) and started again, in a thread; `down` is set while no
    engine answers, `done` once it answers again."""

    def __init__(self, pid: int, argv: list[str]) -> None:
        self.pid, self.argv = pid, argv
        self.down = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
            assert _wait(lambda: _state(self.pid) in ("gone", "Z"), 120), "dockerd did not stop"
            self.down.set()
            time.sleep(1)  # down for a moment: calls made now meet no engine
            _start_dockerd(self.argv)
        except BaseException as exc:
            self.error = exc
        finally:
            self.down.set()
            self.done.set()


@pytest.mark.skipif(os.environ.get("SANDGYM_FAULTS_DOCKERD") != "1",
                    reason="restarts the shared Docker engine: .ci/run sets SANDGYM_FAULTS_DOCKERD=1")
def test_dockerd_restarted_during_a_workload(tmp_path: Path) -> None:
    require("docker")
    found = _dockerd()
    if os.geteuid() != 0 or found is None:
        lacking("needs root and exactly one visible dockerd process")
    pid, argv = found
    assert _live_restore(), "the engine runs without live-restore: run scripts/bootstrap.sh (the runtime installer)"
    run = tmp_path / "run"
    results = run / "results.jsonl"
    cmd = [sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "oracle", "-n", str(N), "-r", str(R),
           "-c", "2", "--provider", "docker", "-o", str(run), "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    restart = Restart(pid, argv)
    misreported: list[str] = []
    lost: list[str] = []
    run_id = f"faults-dockerd-{os.getpid()}"

    async def workload() -> None:
        spec = SandboxSpec(memory_mb=128, disk_mb=32, ttl_s=900)
        async with SandboxManager("docker", max_sandboxes=HELD + 2, run_id=run_id) as mgr:
            held = [await mgr.acquire(spec) for _ in range(HELD)]
            gone: list[ManagedSandbox] = []
            for i, sb in enumerate(held):
                await sb.write_file("/workspace/acked.txt", f"acked {i}")
            await anyio.to_thread.run_sync(
                lambda: _wait(lambda: results.exists() and results.read_text().count("\n") >= 3, 240))
            threading.Thread(target=restart.run, daemon=True).start()
            await anyio.to_thread.run_sync(restart.down.wait)
            # execd killed while no engine answers: whether the container still runs cannot
            # be asked, but init starts execd again, so the sandbox is intact and the exec
            # that killed it is reported interrupted, not lost or failed with the engine's error.
            if restart.done.is_set():
                misreported.append("the engine was back before execd could be killed without it")
            await _interrupted(held[0].exec(["sh", "-c", KILL_EXECD], timeout=60), "execd killed, engine down", misreported)
            try:  # no engine: a create fails, typed
                with anyio.fail_after(120):
                    extra = await mgr.acquire(spec)
                if not restart.done.is_set():
                    misreported.append("a create succeeded while no engine answered")
                await mgr.release(extra)
            except SandboxError:
                pass
            except Exception as exc:
                misreported.append(f"create with the engine down: {type(exc).__name__}: {exc}")
            for phase in ("during", "after"):
                if phase == "after":
                    await anyio.to_thread.run_sync(restart.done.wait)
                for i, sb in enumerate(held):
                    if sb in gone:
                        continue
                    try:
                        with anyio.fail_after(60):
                            got = await sb.read_file("/workspace/acked.txt")
                            r = await sb.exec("echo alive")
                        if got != f"acked {i}".encode() or r.stdout != "alive\n":
                            misreported.append(f"sandbox {i} {phase} the restart: {got!r} {r.stdout!r}")
                    except SandboxGoneError as exc:
                        gone.append(sb)
                        lost.append(f"sandbox {i} {phase} the restart: {exc}")
                    except Exception as exc:
                        misreported.append(f"sandbox {i} {phase} the restart: {type(exc).__name__}: {exc}")
            for sb in gone:  # lost stays lost, and says so
                try:
                    await sb.exec("echo again")
                    misreported.append(f"{sb.id[:12]} answered after it was reported lost")
                except SandboxGoneError:
                    pass
            fresh = await mgr.acquire(spec)
            assert (await fresh.exec("echo fresh")).stdout == "fresh\n"
            # The engine's events are followed again: a sandbox that dies now is told apart.
            _kill_and_wait(await anyio.to_thread.run_sync(_init_host_pid, fresh.id))
            try:
                after_kill = await fresh.exec("echo gone")
            except SandboxGoneError as exc:
                assert exc.reason == "REMOVED", exc
            else:  # what it returned says which way it went wrong
                pytest.fail(f"an exec after the sandbox's init was SIGKILLed returned {after_kill!r}")
            # ... and its container is removed, as `--rm` would have
            assert await anyio.to_thread.run_sync(lambda: _wait(lambda: fresh.id not in _containers(
                f"sandgym.owner={run_id}"), 30)), "the killed sandbox's container was left"

    try:
        anyio.run(workload)
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if not _ping():  # whatever failed, leave an engine running
            if _dockerd() is None:
                _start_dockerd(argv)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert restart.error is None, restart.error
    print(stderr[-3000:])
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    records = [json.loads(x) for x in results.read_text().splitlines()]
    keys = sorted((r["example_id"], r["rollout_index"]) for r in records)
    assert keys == [(e, i) for e in range(N) for i in range(R)], "exactly one record per rollout"
    errored = [r for r in records if r.get("error")]
    for r in records:  # hit by the restart: an error, reward 0; else passed
        if (r["reward"] != 0.0) if r.get("error") else (r["reward"] != 1.0):
            misreported.append(f"rollout {r['example_id']}/{r['rollout_index']}: reward {r['reward']}, {r.get('error')}")
    assert summary["errors"] == len(errored), summary
    print(f"\n[fault] dockerd restarted (live-restore, engine {_engine_version()}): injected 1, sandboxes lost "
          f"{len(lost)} of {HELD} (reported: SandboxGoneError), writes lost {len(lost)} (with them), misreported "
          f"{len(misreported)}; the eval: {len(errored)} of {N * R} rollouts marked as errors, the rest passed")
    print("\n".join(lost))
    assert not misreported, misreported
    assert not lost, lost
    assert _wait(lambda: _containers(f"sandgym.pid={proc.pid}") == [], 60), "the eval's containers were left"
    assert _wait(lambda: _containers(f"sandgym.owner={run_id}") == [], 60), "the workload's containers were left"
