"""`sandgym serve` as a real process; the prime provider spreading over two servers; TTL
reaping on the server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

from sandgym.platform.testing import prime_provider_for_tests, serve_in_thread
from sandgym.sandboxes.ownership import new_run_id, owner_labels
from sandgym.sandboxes.spec import SandboxSpec

from .conftest import IMAGE, backend
from .procs import ServeProcess, _docker_containers, _free_port

SPEC = SandboxSpec(memory_mb=512, disk_mb=256, exec_timeout_s=30)


def test_serve_ephemeral_destroys_on_exit(tmp_path: Path, isolated_home: str) -> None:
    name = backend()
    tokens = tmp_path / "tokens"
    tokens.write_text("# team tokens\nsecret-one  alice quota=3\n\nsecret-two bob\n")
    with ServeProcess("--tokens-file", str(tokens), "--max-sandboxes", "2", "--ephemeral") as srv:
        c = srv.client("secret-two")
        sb = c.create(CreateSandboxRequest(name="cli", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
        c.wait_for_creation(sb.id)
        assert c.execute_command(sb.id, "echo served").stdout == "served\n"
        who = httpx.get(f"{srv.url}/api/v1/user/whoami", headers={"Authorization": "Bearer secret-one"}).json()["data"]
        assert who["key_limits"]["max_concurrent_sandboxes"] == 3  # quota=3 from the tokens file
        if name == "docker":
            assert len(_docker_containers(f"platform.id={sb.id}")) == 1
        # Without state, shutting the server down destroys what it made.
        assert srv.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
        if name == "docker":
            assert _docker_containers(f"platform.id={sb.id}") == []


@pytest.mark.skipif(backend() != "docker", reason="only containers outlive the server process")
def test_restart_keeps_every_sandbox(tmp_path: Path, isolated_home: str) -> None:
    """A stopped (SIGTERM) or crashed (SIGKILL) server leaves its sandboxes running; the next
    one on the same state re-adopts them: same ids, same files, gateway tokens still good. A
    container that vanished while no server ran is reported ERROR, not forgotten."""
    state = tmp_path / "state"
    args = ("--token", "tok", "--state-dir", str(state), "--max-sandboxes", "4")
    srv = ServeProcess(*args)
    try:
        c = srv.client("tok")
        keep = c.create(CreateSandboxRequest(name="keep", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25, labels=["r"]))
        lose = c.create(CreateSandboxRequest(name="lose", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
        c.bulk_wait_for_creation([keep.id, lose.id])
        c.upload_bytes(keep.id, "/workspace/note.txt", b"survives", "note.txt")
        # One server per state directory.
        second = subprocess.run(
            [sys.executable, "-m", "sandgym", "serve", "--port", str(_free_port()), "--provider", backend(), *args],
            capture_output=True, text=True, timeout=120,
        )
        assert second.returncode == 2 and "another `sandgym serve` uses the state directory" in second.stderr
        assert srv.stop() in (0, -signal.SIGTERM)
        # Detached, not destroyed, and marked for the reapers as the platform's (not the dead
        # server process's); kill one container while no server runs.
        assert len(_docker_containers(f"platform.id={keep.id}")) == 1
        assert _docker_containers(f"platform.id={keep.id}") == _docker_containers(
            f"platform.id={keep.id}", "sandgym.owner_kind=platform")
        lost = _docker_containers(f"platform.id={lose.id}")
        subprocess.run(["docker", "rm", "-f", *lost], check=True, capture_output=True)

        srv = ServeProcess(*args, port=srv.port)
        # The SDK's ~/.prime cache still holds the gateway token from before: still good.
        c = srv.client("tok")
        got = c.get(keep.id)
        assert got.status == "RUNNING", (got.error_type, got.error_message, c.get_logs(keep.id))
        assert c.execute_command(keep.id, "cat /workspace/note.txt").stdout == "survives"
        gone = c.get(lose.id)
        assert gone.status == "ERROR" and gone.error_type == "SANDBOX_LOST" and "vanished" in (gone.error_message or "")
        logs = c.get_logs(keep.id)
        assert "re-adopted after a server restart" in logs and "status RUNNING" in logs

        # A crash (no clean shutdown) loses nothing either.
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
        srv = ServeProcess(*args, port=srv.port)
        c = srv.client("tok")
        assert [s.id for s in c.list(labels=["r"]).sandboxes] == [keep.id]
        assert c.execute_command(keep.id, "echo again").stdout == "again\n"
        c.delete(keep.id)
        assert c.get(keep.id).status == "TERMINATED"
        assert srv.stop() in (0, -signal.SIGTERM)
        for _ in range(40):
            if not _docker_containers(f"platform.state={state.resolve()}"):
                break
            time.sleep(0.25)
        assert _docker_containers(f"platform.state={state.resolve()}") == []
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
        leftover = _docker_containers(f"platform.state={state.resolve()}")
        if leftover:
            subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)


@pytest.mark.anyio
async def test_prime_provider_spreads_over_two_servers() -> None:
    async with prime_provider_for_tests(servers=2, backend=backend()) as provider:
        labels = owner_labels(new_run_id())
        sbs = [await provider.create(SPEC, labels) for _ in range(4)]
        try:
            load = provider.load()  # type: ignore[attr-defined]
            assert sorted(load.values()) == [2, 2], load
            hosts = {sb.endpoint.url for sb in sbs}  # type: ignore[attr-defined]
            assert len(hosts) == 2
            for i, sb in enumerate(sbs):
                r = await sb.exec(f"echo {i}", env={"X": "1"})
                assert r.stdout == f"{i}\n"
            listed = await provider.list(labels)
            assert sorted(i.id for i in listed) == sorted(sb.id for sb in sbs)
            assert all(i.owner == labels["sandgym.owner"] for i in listed)
        finally:
            for sb in sbs:
                await sb.close()
        assert await provider.list(labels) == []
        assert sorted(provider.load().values()) == [0, 0]  # type: ignore[attr-defined]


def test_ttl_reaping(isolated_home: str) -> None:
    with serve_in_thread(["tok"], backend(), max_ttl_s=3.0, reap_interval_s=0.5) as srv:
        api = APIClient(api_key="tok")
        api.base_url = srv.url
        c = SandboxClient(api)
        sb = c.create(CreateSandboxRequest(name="ttl", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25, timeout_minutes=-1))
        c.wait_for_creation(sb.id)
        deadline = time.monotonic() + 30
        got = c.get(sb.id)
        while got.status == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.5)
            got = c.get(sb.id)
        assert got.status == "TERMINATED" and got.error_type == "TIMEOUT", got
        assert _settle(srv), "the reaped sandbox was not destroyed"


def _settle(srv: object) -> bool:
    for _ in range(40):
        if srv.service.manager.live == 0:  # type: ignore[attr-defined]
            return True
        time.sleep(0.25)
    return False



def test_idle_reaping(isolated_home: str) -> None:
    with serve_in_thread(["tok"], backend(), idle_timeout_s=2.0, reap_interval_s=0.5) as srv:
        api = APIClient(api_key="tok")
        api.base_url = srv.url
        c = SandboxClient(api)
        sb = c.create(CreateSandboxRequest(name="idle", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
        c.wait_for_creation(sb.id)
        # A command longer than the idle timeout is activity, not idleness.
        assert c.execute_command(sb.id, "sleep 3; echo busy", timeout=30).stdout == "busy\n"
        assert c.get(sb.id).status == "RUNNING"
        deadline = time.monotonic() + 30
        got = c.get(sb.id)
        while got.status == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.5)
            got = c.get(sb.id)
        assert got.status == "TERMINATED" and got.termination_reason == "idle timeout", got
        assert _settle(srv), "the reaped sandbox was not destroyed"
