"""Fault suite, server part: `kill -9` of `sandgym serve` at seeded random moments of a
bounded workload of the unmodified prime-sandboxes SDK (creates with and without egress
allow-lists, execs that write, file uploads, allow-list changes, deletes), restarting it each
time on the same --state-dir with the listening socket held open by a parent, as systemd's
socket unit does. Kills land anywhere: mid-request, mid-create, during the next server's
re-adoption.

After the last restart: every acknowledged sandbox answers, every acknowledged write (exec,
upload, allow-list) reads back and is enforced, every acknowledged delete holds, every error
a client saw was one of the SDK's typed exceptions (never a hang: each call is bounded), and
once everything is deleted no container of the state is left. The last line printed is the
fault table's row (benchmarks/RESULTS.md, "Fault suite").

SANDGYM_SERVE_KILLS (default 12) and SANDGYM_FAULT_SEED (default 23) set the run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prime_sandboxes import (
    APIClient,
    APIError,
    CommandTimeoutError,
    CreateSandboxRequest,
    SandboxClient,
    SandboxNotRunningError,
    UploadTimeoutError,
)

from tests.conftest import require
from tests.platform.procs import (
    ActivatedServe,
    HostTarget,
    _docker_containers,
    wait_healthy,
)

KILLS = int(os.environ.get("SANDGYM_SERVE_KILLS", "12"))
SEED = int(os.environ.get("SANDGYM_FAULT_SEED", "23"))
WORKERS = 3
PER_WORKER = 2  # live sandboxes a worker keeps (it deletes its oldest past that)
TOKEN = "kill9-" + uuid.uuid4().hex[:8]
IMAGE = "sandgym/python:latest"
HOST = "host.sandgym.internal"
TYPED = (APIError, SandboxNotRunningError, CommandTimeoutError, UploadTimeoutError)


@dataclass
class Acked:
    """What the server acknowledged for one sandbox."""

    sid: str
    writes: dict[str, str] = field(default_factory=dict)  # path -> content
    allow: list[str] = field(default_factory=list)  # the last acknowledged allow-list
    deleted: bool = False


@dataclass
class Ledger:
    sandboxes: dict[str, Acked] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    untyped: list[str] = field(default_factory=list)
    misreported: list[str] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _client(url: str) -> SandboxClient:
    api = APIClient(api_key=TOKEN)
    api.base_url = url
    return SandboxClient(api)


def _worker(n: int, url: str, ledger: Ledger, stop: threading.Event) -> None:
    rng = random.Random(SEED * 100 + n)
    c = _client(url)
    mine: list[Acked] = []
    seq = 0
    while not stop.is_set():
        seq += 1
        op = "create" if len(mine) < PER_WORKER else rng.choice(["exec", "exec", "upload", "upload", "network", "delete"])
        try:
            if op == "create":
                allow = rng.choice([[HOST], []])
                sb = c.create(CreateSandboxRequest(
                    name=f"k{n}-{seq}", docker_image=IMAGE, memory_gb=0.25, cpu_cores=0.25, disk_size_gb=0.05,
                    timeout_minutes=30, network_allowlist=allow,
                ))
                acked = Acked(sb.id, allow=allow)
                with ledger.lock:
                    ledger.sandboxes[sb.id] = acked
                mine.append(acked)
                c.wait_for_creation(sb.id, max_attempts=30)
            elif op == "exec":
                sb = rng.choice(mine)
                path, token = f"/workspace/e{n}-{seq}", uuid.uuid4().hex
                r = c.execute_command(sb.sid, f"echo {token} > {path} && cat {path}", timeout=60)
                if r.exit_code == 0:
                    if r.stdout != f"{token}\n":
                        ledger.misreported.append(f"exec in {sb.sid} answered {r.stdout!r}, wrote {token!r}")
                    sb.writes[path] = f"{token}\n"
            elif op == "upload":
                sb = rng.choice(mine)
                path, data = f"/workspace/u{n}-{seq}", uuid.uuid4().hex
                c.upload_bytes(sb.sid, path, data.encode(), "u", timeout=60)
                sb.writes[path] = data
            elif op == "network":
                sb = rng.choice(mine)
                allow = [HOST] if not sb.allow else []
                # Closing is deny-everything (the SDK refuses an empty allow-list).
                got = c.set_network(sb.sid, allow=allow) if allow else c.set_network(sb.sid, deny=["*"])
                if got.policy.allowlist != allow:
                    ledger.misreported.append(f"set_network on {sb.sid} answered {got.policy}")
                sb.allow = allow
            else:
                sb = mine.pop(0)
                c.delete(sb.sid)
                sb.deleted = True
            ledger.ops[op] += 1
        except TYPED as exc:
            ledger.errors[f"{op}: {type(exc).__name__}"] += 1
        except Exception as exc:  # anything else is a defect: the SDK's contract is typed errors
            ledger.untyped.append(f"{op}: {type(exc).__name__}: {exc}")
        time.sleep(rng.uniform(0.0, 0.2))


def test_kill_9_at_random_moments_loses_nothing(tmp_path: Path, isolated_home: str) -> None:
    require("docker")
    rng = random.Random(SEED)
    target = HostTarget()
    state = tmp_path / "state"
    server = ActivatedServe(
        "--token", TOKEN, "--state-dir", str(state), "--max-sandboxes", str(WORKERS * PER_WORKER + 2),
        "--egress-host-port", str(target.port), log_path=tmp_path / "serve.log",
    )
    ledger = Ledger()
    stop = threading.Event()
    workers = [threading.Thread(target=_worker, args=(n, server.url, ledger, stop), daemon=True) for n in range(WORKERS)]
    kills = 0
    try:
        server.start()
        wait_healthy(server.url, server.alive)
        for w in workers:
            w.start()
        for _ in range(KILLS):
            if rng.random() < 0.25:  # while it starts: imports, the state, re-adoption
                time.sleep(rng.uniform(0.0, 3.0))
            else:  # while it serves
                wait_healthy(server.url, server.alive)
                time.sleep(rng.uniform(0.2, 3.0))
            assert server.stop(signal.SIGKILL) == -signal.SIGKILL
            kills += 1
            server.start()  # the socket never closed: clients wait in its backlog meanwhile
        time.sleep(rng.uniform(0.5, 2.0))
        stop.set()
        for w in workers:
            w.join(300)  # every SDK call is bounded; a worker still running here hangs
        hung = [w.name for w in workers if w.is_alive()]
        assert not hung, f"SDK calls hung across the kills: {hung}"
        wait_healthy(server.url, server.alive)

        # ---- what the clients were told must be what is there -------------------------------
        c = _client(server.url)
        lost: list[str] = []
        writes_lost: list[str] = []
        for acked in ledger.sandboxes.values():
            if acked.deleted:
                got = c.get(acked.sid)
                if got.status == "ERROR":  # it was lost before the client deleted it
                    lost.append(f"{acked.sid}: {got.error_type} {got.error_message}")
                elif got.status != "TERMINATED":
                    ledger.misreported.append(f"{acked.sid}: deleted, but {got.status}")
                continue
            try:
                c.wait_for_creation(acked.sid, max_attempts=60)
            except TYPED as exc:
                got = c.get(acked.sid)
                lost.append(f"{acked.sid}: {got.status} {got.error_type} {got.error_message} ({type(exc).__name__})")
                continue
            r = c.execute_command(acked.sid, "echo alive")
            if r.stdout != "alive\n":
                lost.append(f"{acked.sid}: RUNNING but answered {r}")
                continue
            for path, content in acked.writes.items():
                r = c.execute_command(acked.sid, f"cat {path}")
                if r.exit_code != 0 or r.stdout != content:
                    writes_lost.append(f"{acked.sid}:{path}: {r.exit_code} {r.stdout!r} != {content!r}")
            net = c.get_network(acked.sid)
            if net.policy.allowlist != acked.allow or not net.applied:
                writes_lost.append(f"{acked.sid}: allow-list {net.policy.allowlist} (applied {net.applied}) != {acked.allow}")
            r = c.execute_command(acked.sid, target.fetch_command(), timeout=60)
            want = target.BODY.decode() if acked.allow else "refused 403"
            if not r.stdout.startswith(want):
                writes_lost.append(f"{acked.sid}: allow-list {acked.allow} not enforced: {r.stdout!r}")
        live = [a for a in ledger.sandboxes.values() if not a.deleted]
        print(f"\nops: {dict(ledger.ops)}  typed errors: {dict(ledger.errors)}")
        print(f"acknowledged sandboxes {len(ledger.sandboxes)} ({len(live)} not deleted), "
              f"writes {sum(len(a.writes) for a in ledger.sandboxes.values())}")
        print("| fault | injected | sandboxes lost | writes lost | misreported |")
        print(f"| kill -9 of `sandgym serve` (seed {SEED}) | {kills} | {len(lost)} | {len(writes_lost)} | "
              f"{len(ledger.misreported) + len(ledger.untyped)} |")
        for what in (lost, writes_lost, ledger.misreported, ledger.untyped):
            for line in what:
                print(" ", line)
        assert kills >= 10
        assert ledger.ops["create"] > 0 and ledger.ops["exec"] + ledger.ops["upload"] > 0, dict(ledger.ops)
        assert not ledger.untyped, ledger.untyped
        assert not lost, lost
        assert not writes_lost, writes_lost
        assert not ledger.misreported, ledger.misreported

        for acked in live:
            c.delete(acked.sid)
        for sb in c.list(per_page=100).sandboxes:  # creates whose answer was lost to a kill
            if sb.status not in ("TERMINATED", "ERROR"):
                c.delete(sb.id)
        assert server.stop(signal.SIGTERM) == 0
        deadline = time.monotonic() + 60
        while _docker_containers(f"platform.state={state.resolve()}") and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _docker_containers(f"platform.state={state.resolve()}") == [], "containers left after every delete"
    finally:
        stop.set()
        server.close()
        target.close()
        leftover = _docker_containers(f"platform.state={state.resolve()}")
        if leftover:
            subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The SDK's ~/.prime auth cache is this test's own."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return str(home)
