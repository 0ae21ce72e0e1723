"""Re-adoption of every sandbox kind across every kind of server restart, driven by the
unmodified prime-sandboxes SDK mid-run.

Kinds, for each profile (strict; vm under gVisor): no network, an allow-list, a deny-list, a
policy changed after create (generation 2), an image without python3 (no execd: `docker
exec`), each on its own per-sandbox disk, and a live process (`open_process`) running in one
of them. Restarts, in turn on the same --state-dir: SIGTERM (drain, exit 0), SIGKILL (a crash)
and SIGHUP (re-exec in place). The server gets its listening socket from a parent that holds
it (as systemd's socket unit), so the SDK's calls during a restart wait instead of failing.
After each: the same containers, RUNNING, every file written before reads back, each
policy still enforced as set, the live process answers its stdin. Platform sandboxes carry
no owner lifeline (they must outlive the server); an --ephemeral server's do, and go with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest
from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest

from tests.conftest import require

from .conftest import IMAGE, need_docker_backend
from .procs import (
    ActivatedServe,
    HostTarget,
    ServeProcess,
    _docker_containers,
    left_after_deletes,
    no_python_image,
    serve_env,
    wait_healthy,
)

pytestmark = pytest.mark.anyio

TOKEN = "matrix-" + uuid.uuid4().hex[:8]
HOST = "host.sandgym.internal"
LIVE_CMD = "while read l; do echo got:$l:$$; done"


def _expected(kind: str, target: HostTarget) -> str | None:
    """What the sandbox's fetch of the host target prints (None: no python3 to fetch with)."""
    return {
        "none": "unreachable",  # no proxy, no network: the name does not even resolve
        "allow": target.BODY.decode(),
        "deny": "refused 403",
        "changed": target.BODY.decode(),
        "no-python": None,
    }[kind]


async def _wait_line(stream: object, want: bytes, seen: bytearray, timeout_s: float) -> bool:
    """Read `stream` (an SDK process's stdout) until `want` shows up; False on timeout."""
    with anyio.move_on_after(timeout_s):
        async for chunk in stream:  # type: ignore[attr-defined]
            seen += chunk
            if want in seen:
                return True
    return want in seen


@pytest.mark.parametrize("profile", ["strict", "vm"])
async def test_every_kind_survives_every_restart(
    profile: str, tmp_path: Path, isolated_home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_docker_backend("re-adoption (only containers outlive the server)")
    require("egress", *(["vm"] if profile == "vm" else []))
    target = HostTarget()
    state = tmp_path / "state"
    server = ActivatedServe(
        "--token", TOKEN, "--state-dir", str(state), "--max-sandboxes", "6", "--profile", profile,
        "--egress-host-port", str(target.port), "--drain-timeout", "30", log_path=tmp_path / "serve.log",
    )
    monkeypatch.setenv("PRIME_API_BASE_URL", server.url)
    monkeypatch.setenv("PRIME_API_KEY", TOKEN)
    server.start()
    client = AsyncSandboxClient()
    ids: dict[str, str] = {}
    try:
        await anyio.to_thread.run_sync(wait_healthy, server.url, server.alive)
        base = {"memory_gb": 0.5, "cpu_cores": 0.5, "disk_size_gb": 0.125, "timeout_minutes": 60}
        asks: dict[str, dict[str, object]] = {
            "none": {},
            "allow": {"network_allowlist": [HOST]},
            "deny": {"network_denylist": [HOST]},
            "changed": {"network_allowlist": []},
            "no-python": {"docker_image": await anyio.to_thread.run_sync(no_python_image)},
        }
        for kind, ask in asks.items():
            req = {"name": f"{kind}-{uuid.uuid4().hex[:6]}", "docker_image": IMAGE, **base, **ask}
            ids[kind] = (await client.create(CreateSandboxRequest(**req))).id  # type: ignore[arg-type]
        await client.bulk_wait_for_creation(list(ids.values()))
        changed = await client.set_network(ids["changed"], allow=[HOST])
        assert changed.applied and changed.generation == 2
        containers = {k: _docker_containers(f"platform.id={sid}") for k, sid in ids.items()}
        assert all(len(c) == 1 for c in containers.values()), containers
        # A platform sandbox has no owner lifeline: nothing ties it to the server's process.
        assert all(_docker_containers(f"platform.id={sid}", "sandgym.owner_kind=platform") == containers[k]
                   for k, sid in ids.items())

        proc = await client.open_process(ids["allow"], LIVE_CMD)
        seen = bytearray()
        await proc.write_stdin(b"first\n")
        assert await _wait_line(proc.stdout, b"got:first:", seen, 30), bytes(seen)
        live_pid = bytes(seen).split(b"got:first:")[1].split(b"\n")[0]

        async def check(round_no: int) -> None:
            """Each sandbox as it should be, with files round-0..round_no; writes the next."""
            for kind, sid in ids.items():
                got = await client.get(sid)
                assert got.status == "RUNNING", (kind, got.status, got.error_type, got.error_message)
                assert _docker_containers(f"platform.id={sid}") == containers[kind], kind  # the same container
                files = " ".join(f"/workspace/round-{i}.txt" for i in range(round_no + 1))
                r = await client.execute_command(sid, f"cat {files}")
                assert r.exit_code == 0 and r.stdout == "".join(f"{kind} {i}\n" for i in range(round_no + 1)), (kind, r)
                want = _expected(kind, target)
                if want is not None:
                    r = await client.execute_command(sid, target.fetch_command(), timeout=60)
                    assert r.stdout.startswith(want), (kind, r)
                await client.upload_bytes(sid, f"/workspace/round-{round_no + 1}.txt", f"{kind} {round_no + 1}\n".encode(), "x")

        for kind, sid in ids.items():
            await client.upload_bytes(sid, "/workspace/round-0.txt", f"{kind} 0\n".encode(), "x")
        await check(0)

        for round_no, sig in enumerate((signal.SIGTERM, signal.SIGKILL, signal.SIGHUP)):
            if sig == signal.SIGHUP:
                os.kill(server.pid, signal.SIGHUP)  # re-exec in place: same pid, same socket
            else:
                code = await anyio.to_thread.run_sync(server.stop, sig)
                assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
                server.start()
            # The SDK's calls wait in the socket's backlog: no refusal, no retry needed.
            await check(round_no + 1)
            # The live process is the same one, re-attached: its stdin and output still work.
            # (Output written while no server ran is not replayed, as the SDK documents, so
            # ask until an answer comes through the re-attached stream.)
            answered = False
            for attempt in range(20):
                await proc.write_stdin(f"r{round_no}-{attempt}\n".encode())
                if await _wait_line(proc.stdout, f"got:r{round_no}-".encode(), seen, 3):
                    answered = True
                    break
            assert answered, (sig, bytes(seen)[-500:])
            answer = bytes(seen).rsplit(f"got:r{round_no}-".encode(), 1)[1].split(b"\n")[0]
            assert answer.split(b":")[-1] == live_pid, (answer, live_pid)  # the same process
        logs = await client.get_logs(ids["allow"])
        # (Event-log lines are written in batches: a killed server's last ones are not kept.)
        assert "re-adopted after a server restart" in logs and "re-attached" in logs, logs[-2000:]
        assert proc.returncode is None
        await proc.kill()
        assert await proc.wait() in (-9, 137)
    finally:
        for sid in ids.values():
            try:
                await client.delete(sid)
            except Exception:
                pass
        await client.aclose()
        if server.alive():
            assert await anyio.to_thread.run_sync(server.stop, signal.SIGTERM) == 0
        server.close()
        target.close()
        leftover = await anyio.to_thread.run_sync(left_after_deletes, state)
        assert leftover == [], "sandboxes left after their deletes"


def test_ephemeral_server_sandboxes_go_with_a_killed_server(tmp_path: Path, isolated_home: str) -> None:
    """Without state, the server's sandboxes are its process's (owner lifeline): a kill -9
    of the server stops them at once, with no server left to clean up, and the next sandgym
    process (here `sandbox prune`) removes the stopped containers."""
    need_docker_backend("the owner lifeline, tested here on containers")
    srv = ServeProcess("--token", TOKEN, "--ephemeral", "--max-sandboxes", "2")
    try:
        c = srv.client(TOKEN)
        sb = c.create(CreateSandboxRequest(name="eph", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.125))
        c.wait_for_creation(sb.id)
        assert len(_docker_containers(f"platform.id={sb.id}", "sandgym.owner_kind=process")) == 1
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
        deadline = time.monotonic() + 60
        while _docker_containers(f"platform.id={sb.id}", running=True) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _docker_containers(f"platform.id={sb.id}", running=True) == [], "still running without its server"
        pruned = subprocess.run([sys.executable, "-m", "sandgym", "sandbox", "prune"], capture_output=True,
                                text=True, env=serve_env(), timeout=120)
        assert pruned.returncode == 0, pruned.stderr
        assert _docker_containers(f"platform.id={sb.id}") == [], pruned.stdout
    finally:
        srv.__exit__()
        leftover = _docker_containers(f"platform.id={sb.id}") if "sb" in locals() else []
        if leftover:
            subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)
