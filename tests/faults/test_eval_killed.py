"""`sandgym eval` SIGKILLed mid-run, its sandboxes told to outlive it for a while
(SANDGYM_ORPHAN_GRACE_S, so their lifeline does not end them first): `sandgym sandbox
prune` removes exactly those (their owner pid is dead), and `--resume` completes the run
with exactly one record per rollout. (tests/faults/test_orphans.py: the same crash cleaned
up with no prune at all.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = [pytest.mark.docker]

N, R = 8, 2


def _containers_of_pid(pid: int) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": f"sandgym.pid={pid}"})]
    finally:
        client.close()


def test_eval_sigkilled_then_pruned_and_resumed(tmp_path: Path) -> None:
    require("docker")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "oracle", "-n", str(N), "-r", str(R), "-c", "2", "--provider", "docker"]
    env = {**os.environ, "SANDGYM_ORPHAN_GRACE_S": "600"}
    proc = subprocess.Popen([*cmd, "-o", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=env)  # fmt: skip
    results = run / "results.jsonl"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # mid-run, and holding sandboxes (between two rollouts it may hold none)
            if results.exists() and results.read_text().count("\n") >= 3 and _containers_of_pid(proc.pid):
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = [x for x in results.read_text().splitlines() if x.strip()]
    assert 3 <= len(before) < N * R, "the kill should land mid-run"

    # A create the engine was still serving when the driver died may finish a moment later,
    # and any other sandgym process on the host (other tests run in parallel) may reap the
    # orphans as soon as it starts: the orphans are every sandbox of the dead pid seen until
    # the list has settled, not only those still listed at the end.
    listed = _containers_of_pid(proc.pid)
    orphans = set(listed)
    for _ in range(20):
        time.sleep(0.25)
        now = _containers_of_pid(proc.pid)
        orphans |= set(now)
        if now == listed:
            break
        listed = now
    try:
        assert orphans, "a SIGKILLed eval leaves its live sandboxes behind (the case prune exists for)"
        out = subprocess.run(
            [sys.executable, "-m", "sandgym", "sandbox", "prune", "--provider", "docker", "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
        # Every sandgym process on the host reaps dead owners' sandboxes (other tests' managers
        # run in parallel), so prune may find some already gone; none may be left or fail.
        assert not orphans & (set(report["failed"]) | set(report["kept"])), report
        assert _containers_of_pid(proc.pid) == []
    finally:  # never leave ours behind, whatever failed above
        import docker

        client = docker.from_env()
        for cid in _containers_of_pid(proc.pid):
            client.api.remove_container(cid, force=True)
        client.close()

    resumed = subprocess.Popen([*cmd, "--resume", str(run), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr[-2000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["num_rollouts"] == N * R and summary["errors"] == 0 and summary["reward_mean"] == 1.0, summary
    keys = [(r["example_id"], r["rollout_index"]) for r in map(json.loads, results.read_text().splitlines())]
    assert sorted(keys) == [(e, i) for e in range(N) for i in range(R)]  # exactly one record each
    # the resumed run cleaned up after itself
    assert _containers_of_pid(resumed.pid) == []
