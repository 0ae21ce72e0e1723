"""Allow-lists for real, through the unmodified SDK: a sandbox created with
network_allowlist installs from PyPI, a host not on the list fails fast, the egress log shows
both, and set_network/get_network change and report the policy of the running sandbox.
Skips (saying why) where the engine has no egress proxy or PyPI cannot be reached."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

from sandgym.platform.testing import ServerThread, serve_in_thread
from tests.conftest import require

from .conftest import IMAGE, backend, need_docker_backend

TOKEN = "net-token"
PYPI = ["pypi.org", "files.pythonhosted.org"]


def need_egress() -> None:
    """Egress through the docker provider, and PyPI (the allow-listed destination) reachable."""
    need_docker_backend("egress")
    require("egress", "pypi")


@pytest.fixture(scope="module")
def srv(isolated_home: str) -> Iterator[ServerThread]:
    need_egress()
    with serve_in_thread([TOKEN], backend(), max_sandboxes=2) as s:
        yield s


def _client(s: ServerThread) -> SandboxClient:
    api = APIClient(api_key=TOKEN)
    api.base_url = s.url
    return SandboxClient(api)


def _log(s: ServerThread, sid: str, host: str) -> list[dict[str, object]]:
    """The sandbox's egress log once it has a line of `host`, or as it is after 10 s (the
    proxy writes a line when it has finished the request, a moment after the client may)."""
    for _ in range(100):
        r = httpx.get(f"{s.url}/api/v1/sandbox/{sid}/egress-log", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        entries = list(r.json()["entries"])
        if any(e["host"] == host for e in entries):
            break
        time.sleep(0.1)
    return entries


def test_allow_list_pip_install_and_refusal(srv: ServerThread) -> None:
    c = _client(srv)
    sb = c.create(CreateSandboxRequest(name=f"n-{uuid.uuid4().hex[:6]}", docker_image=IMAGE, memory_gb=1,
                                       disk_size_gb=0.25, network_allowlist=PYPI))
    try:
        assert sb.network_allowlist == PYPI and sb.network_denylist is None
        c.wait_for_creation(sb.id)
        status = c.get_network(sb.id)
        assert status.applied and status.policy.allowlist == PYPI
        r = c.execute_command(sb.id, "pip install --user --break-system-packages --no-cache-dir --retries 0 six==1.16.0 && python3 -c 'import six; print(six.__version__)'", timeout=300)
        assert r.exit_code == 0 and r.stdout.strip().endswith("1.16.0"), r.stderr[-2000:]
        fetch = "python3 -c \"import urllib.request as u; u.urlopen('https://deb.debian.org/', timeout=20)\""
        r = c.execute_command(sb.id, fetch, timeout=60)
        assert r.exit_code != 0 and "403" in r.stderr, (r.exit_code, r.stderr[-1000:])
        entries = _log(srv, sb.id, "deb.debian.org")
        hosts = {(e["host"], e["allowed"]) for e in entries}
        assert ("pypi.org", True) in hosts and ("deb.debian.org", False) in hosts, entries

        # Closed at run time: the same install now fails fast.
        closed = c.set_network(sb.id, deny=["*"])
        assert closed.applied and closed.policy.allowlist == [] and closed.generation == 2
        assert c.get(sb.id).network_allowlist == []
        r = c.execute_command(sb.id, "pip download --no-cache-dir --retries 0 --no-deps -d /tmp/x six==1.16.0", timeout=120)
        assert r.exit_code != 0
        # And opened to everything ("*" maps to an empty deny-list).
        opened = c.set_network(sb.id, allow=["*"])
        assert opened.policy.denylist == [] and opened.policy.allowlist is None and opened.applied
        got = c.get(sb.id)
        assert got.network_denylist == [] and got.network_allowlist is None  # the CLI: "Unrestricted"
    finally:
        c.delete(sb.id)


def test_network_access_field(srv: ServerThread) -> None:
    """Prime's older `network_access` flag: true is unrestricted, false is closed (but can be
    opened later), and the answers say so."""
    h = {"Authorization": f"Bearer {TOKEN}"}
    base = {"name": "na", "docker_image": IMAGE, "memory_gb": 0.5, "disk_size_gb": 0.25}
    made = []
    try:
        for flag, allow, deny in ((True, None, []), (False, [], None)):
            r = httpx.post(f"{srv.url}/api/v1/sandbox", json={**base, "network_access": flag}, headers=h)
            assert r.status_code == 200, r.text
            made.append(r.json()["id"])
            assert (r.json()["networkAllowlist"], r.json()["networkDenylist"]) == (allow, deny)
        c = _client(srv)
        c.bulk_wait_for_creation(made)
        assert c.set_network(made[1], allow=PYPI).applied  # false kept the plumbing
    finally:
        for sid in made:
            httpx.delete(f"{srv.url}/api/v1/sandbox/{sid}", headers=h)
