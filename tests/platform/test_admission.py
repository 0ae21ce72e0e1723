"""Per-token quotas below the host cap, fair admission between tokens with the waiting reason
shown, and sandboxes that die on their own reported ERROR with a type."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx
import pytest
from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient, SandboxNotRunningError

from sandgym.platform.service import ServerConfig
from sandgym.platform.testing import ServerThread, serve_in_thread

from .conftest import IMAGE, backend


def _client(srv: ServerThread, token: str) -> SandboxClient:
    api = APIClient(api_key=token)
    api.base_url = srv.url
    return SandboxClient(api)


def _until(pred: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def _req(name: str) -> CreateSandboxRequest:
    return CreateSandboxRequest(name=name, docker_image=IMAGE, memory_gb=0.5, cpu_cores=0.5, disk_size_gb=0.25)


def test_default_quota_is_below_the_host_cap() -> None:
    assert ServerConfig(tokens=["a"], max_sandboxes=8).default_quota() == 8
    assert ServerConfig(tokens=["a", "b"], max_sandboxes=8).default_quota() == 4
    assert ServerConfig(tokens=["a", "b"], max_sandboxes=8, quota=6).default_quota() == 6


def test_fair_admission_and_waiting_reason(isolated_home: str) -> None:
    """Host cap 2, quota 3 per token. A fills the host and queues a third; B and C queue after
    it with a reason shown. Each freed slot goes to the waiting token holding the fewest
    slots, even past A's older request."""
    with serve_in_thread(["ta", "tb", "tc"], backend(), max_sandboxes=2, quota=3, status_wait_s=0.2) as srv:
        a, b, c = (_client(srv, t) for t in ("ta", "tb", "tc"))
        a1, a2 = a.create(_req("a1")), a.create(_req("a2"))
        a.bulk_wait_for_creation([a1.id, a2.id])
        a3 = a.create(_req("a3"))
        b1 = b.create(_req("b1"))
        c1 = c.create(_req("c1"))
        got = b.get(b1.id)
        assert got.status == "PENDING"
        raw = httpx.get(f"{srv.url}/api/v1/sandbox/{b1.id}", headers={"Authorization": "Bearer tb"}).json()
        assert "waiting for a free slot" in raw["waitingReason"] and "2 of its 2" in raw["waitingReason"]
        assert got.error_message == raw["waitingReason"]  # what SDK users see
        assert raw["advancedConfigs"]["waitingReason"] == raw["waitingReason"]  # what `prime sandbox get` prints
        # B goes first (holds none), then C (holds none), then A (holds two).
        assert "0 queued ahead" in raw["waitingReason"]
        assert "1 queued ahead" in (c.get(c1.id).error_message or "")
        assert "2 queued ahead" in (a.get(a3.id).error_message or "")
        snap = b.get_sandbox_statuses([b1.id]).statuses[0]
        assert snap.status == "PENDING" and "free slot" in (snap.error_message or "")
        # A's quota is 3 (queued ones count): a fourth create is refused now, not queued.
        r = httpx.post(f"{srv.url}/api/v1/sandbox", json={"name": "a4", "docker_image": IMAGE, "memory_gb": 0.5, "disk_size_gb": 0.25}, headers={"Authorization": "Bearer ta"})
        assert r.status_code == 429 and "quota" in r.json()["detail"]

        a.delete(a1.id)  # A's older a3 waits: B holds none
        b.wait_for_creation(b1.id)
        assert b.get(b1.id).error_message is None and a.get(a3.id).status == "PENDING"
        a.delete(a2.id)  # A and C hold none now: A's a3 asked before C's c1
        a.wait_for_creation(a3.id)
        assert c.get(c1.id).status == "PENDING" and "0 queued ahead" in (c.get(c1.id).error_message or "")
        b.delete(b1.id)
        c.wait_for_creation(c1.id)
        assert srv.service.metrics()["queued"] == 0
        for cl, sid in ((a, a3.id), (c, c1.id)):
            cl.delete(sid)


@pytest.mark.skipif(backend() != "docker", reason="kills the sandbox's container")
def test_a_sandbox_that_dies_is_error_with_a_type(isolated_home: str) -> None:
    with serve_in_thread(["td"], backend(), reap_interval_s=0.3) as srv:
        c = _client(srv, "td")
        sb = c.create(_req("dies"))
        c.wait_for_creation(sb.id)
        cid = srv.service.store.get_any(sb.id).container_id  # type: ignore[union-attr]
        assert cid
        subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True)
        _until(lambda: c.get(sb.id).status == "ERROR", 30)
        got = c.get(sb.id)
        assert got.error_type in ("SANDBOX_REMOVED", "SANDBOX_LOST") and got.error_message
        assert got.termination_reason and got.error_type in got.termination_reason  # shown by `prime sandbox get`
        with pytest.raises(SandboxNotRunningError):
            c.execute_command(sb.id, "true")
        _until(lambda: srv.service.manager.live == 0, 30)  # its slot is free again
