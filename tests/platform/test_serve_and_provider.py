"""`sandgym serve` as a real process; the prime provider spreading over two servers; TTL
reaping on the server."""

from __future__ import annotations

import signal
import socket
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

SPEC = SandboxSpec(memory_mb=512, disk_mb=256, exec_timeout_s=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker_containers(label: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True)
    return out.stdout.split()


def test_serve_command_process(tmp_path: Path, isolated_home: str) -> None:
    name = backend()
    port = _free_port()
    tokens = tmp_path / "tokens"
    tokens.write_text("# team tokens\nsecret-one  alice\n\nsecret-two bob\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandgym", "serve", "--port", str(port), "--tokens-file", str(tokens),
         "--max-sandboxes", "2", "--provider", name, "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        api = APIClient(api_key="secret-two")
        api.base_url = url  # the SDK's public attribute; no env needed
        c = SandboxClient(api)
        sb = c.create(CreateSandboxRequest(name="cli", docker_image=IMAGE, memory_gb=0.5))
        c.wait_for_creation(sb.id)
        assert c.execute_command(sb.id, "echo served").stdout == "served\n"
        if name == "docker":
            assert len(_docker_containers(f"platform.id={sb.id}")) == 1
        # Shutting the server down destroys what it made (the client never deleted it).
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
        if name == "docker":
            assert _docker_containers(f"platform.id={sb.id}") == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
        sb = c.create(CreateSandboxRequest(name="ttl", docker_image=IMAGE, memory_gb=0.5, timeout_minutes=-1))
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
        sb = c.create(CreateSandboxRequest(name="idle", docker_image=IMAGE, memory_gb=0.5))
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
