"""The Docker engine restarted in the middle of `sandgym eval`.

Opt-in (SANDGYM_FAULTS_DOCKERD=1, root, a dockerd we can see): restarting the engine stops
every container on it (live-restore is off here), other users' included. The engine is
restarted with the exact argv it was started with (e.g. `dockerd --bridge=none
--iptables=false --ip6tables=false`), its output appended to the same log, and the test
makes sure an engine is running again whatever happens.

Asserted: the eval exits 0; every rollout has exactly one record; the rollouts the restart
hit are marked (an error recorded, reward 0) and reported in the summary, the others passed;
no container of the eval process is left once it has finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import lacking, require

pytestmark = [pytest.mark.docker, pytest.mark.faults, pytest.mark.slow]

N, R = 10, 2
DOCKERD_LOG = "/var/log/dockerd.log"


def _dockerd() -> tuple[int, list[str]] | None:
    out = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    if len(pids) != 1:
        return None
    with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    return pids[0], argv


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


def _wait(pred, timeout: float) -> bool:  # noqa: ANN001
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


def restart_dockerd(pid: int, argv: list[str]) -> None:
    os.kill(pid, signal.SIGTERM)
    assert _wait(lambda: not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z", 120), "dockerd did not stop"
    _start_dockerd(argv)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0].decode()
    except OSError:
        return "gone"


def _containers_of_pid(pid: int) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": f"sandgym.pid={pid}"})]
    finally:
        client.close()


@pytest.mark.skipif(os.environ.get("SANDGYM_FAULTS_DOCKERD") != "1",
                    reason="restarts the shared Docker engine: .ci/run sets SANDGYM_FAULTS_DOCKERD=1")
def test_dockerd_restarted_during_eval(tmp_path: Path) -> None:
    require("docker")
    found = _dockerd()
    if os.geteuid() != 0 or found is None:
        lacking("needs root and exactly one visible dockerd process")
    pid, argv = found
    run = tmp_path / "run"
    results = run / "results.jsonl"
    cmd = [sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "oracle", "-n", str(N), "-r", str(R),
           "-c", "2", "--provider", "docker", "-o", str(run), "--json"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _wait(lambda: results.exists() and results.read_text().count("\n") >= 3, 120), "the eval made no progress"
        restart_dockerd(pid, argv)
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if not _ping():  # whatever failed, leave an engine running
            found_now = _dockerd()
            if found_now is None:
                _start_dockerd(argv)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(stderr[-3000:])
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    records = [json.loads(x) for x in results.read_text().splitlines()]
    keys = sorted((r["example_id"], r["rollout_index"]) for r in records)
    assert keys == [(e, i) for e in range(N) for i in range(R)], "exactly one record per rollout"
    errored = [r for r in records if r.get("error")]
    for r in records:
        if r.get("error"):
            assert r["reward"] == 0.0, r
        else:
            assert r["reward"] == 1.0, (r["example_id"], r["rollout_index"], r["reward"])
    assert summary["errors"] == len(errored), summary
    print(f"dockerd restart: {len(errored)} of {N * R} rollouts marked: {sorted({r['error'][:120] for r in errored})}")
    assert _wait(lambda: _containers_of_pid(proc.pid) == [], 60), f"orphans: {_containers_of_pid(proc.pid)}"
