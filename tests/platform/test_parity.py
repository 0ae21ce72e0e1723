"""Prime fields and endpoints beyond the basics, through the unmodified SDK (sync and async)
and raw HTTP: network lists and egress policies, `delete --all`'s body, whoami."""

from __future__ import annotations

import uuid

import httpx
import pytest
from prime_sandboxes import APIClient, APIError, AsyncSandboxClient, CreateSandboxRequest, SandboxClient

from sandgym.platform.testing import ServerThread

from .conftest import IMAGE, TOKEN_A, TOKEN_B

pytestmark = pytest.mark.anyio


def _h(token: str = TOKEN_A) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _req(**kw: object) -> CreateSandboxRequest:
    return CreateSandboxRequest(name=f"p-{uuid.uuid4().hex[:6]}", docker_image=IMAGE, memory_gb=0.5, cpu_cores=0.5, disk_size_gb=0.25, **kw)  # type: ignore[arg-type]


def test_default_network_is_reported_as_blocked(server: ServerThread) -> None:
    """No network asked and none by default: every view says so (the CLI prints "Blocked"
    for allowlist=[], and "Unrestricted" only for what really is)."""
    c = SandboxClient(APIClient())
    sb = c.create(_req())
    try:
        assert sb.network_allowlist == [] and sb.network_denylist is None
        c.wait_for_creation(sb.id)  # applied once the sandbox runs with it
        status = c.get_network(sb.id)
        assert status.policy.allowlist == [] and status.policy.denylist is None and status.applied
        # Closing it again is fine; opening it is refused up front with the reason (409).
        assert c.set_network(sb.id, deny=["*"]).applied
        with pytest.raises(APIError, match="409.*made without network"):
            c.set_network(sb.id, allow=["pypi.org"])
        assert c.get_network(sb.id).policy.allowlist == []
    finally:
        c.delete(sb.id)


def test_network_fields_are_validated_like_prime(server: ServerThread) -> None:
    """Raw HTTP gets the 422s the SDK raises client-side, each naming the field, and nothing
    is created."""
    before = httpx.get(f"{server.url}/api/v1/sandbox", headers=_h()).json()["total"]
    base = {"name": "n", "docker_image": IMAGE}
    cases = [
        ({"network_allowlist": ["user@pypi.org"]}, "network_allowlist", "credentials"),
            ({"network_allowlist": ["http://pypi.org"]}, "network_allowlist", "CIDR"),
        ({"network_allowlist": ["pypi.org:8080"]}, "network_allowlist", "80 and 443"),
        ({"network_denylist": ["a.*.org"]}, "network_denylist", "leftmost"),
        ({"network_allowlist": ["::1"]}, "network_allowlist", "IPv6"),
        ({"network_allowlist": ["x"] * 1025}, "network_allowlist", "1024"),
        ({"network_allowlist": ["pypi.org"], "network_denylist": []}, "body", "mutually exclusive"),
        ({"network_access": True, "network_denylist": []}, "body", "mutually exclusive"),
    ]
    for extra, field, words in cases:
        r = httpx.post(f"{server.url}/api/v1/sandbox", json={**base, **extra}, headers=_h())
        assert r.status_code == 422, (extra, r.text)
        detail = r.json()["detail"]
        assert any(field in map(str, e["loc"]) and words in e["msg"] for e in detail), (extra, detail)
    assert httpx.get(f"{server.url}/api/v1/sandbox", headers=_h()).json()["total"] == before
    # The egress-policy PUT: exactly one list, entries checked the same way.
    r = httpx.put(f"{server.url}/api/v1/sandbox/sbnope/egress-policy", json={"allowlist": ["a.org"]}, headers=_h())
    assert r.status_code == 404


async def test_egress_policy_endpoints_async(server: ServerThread) -> None:
    c = AsyncSandboxClient()
    try:
        sb = await c.create(_req())
        try:
            await c.wait_for_creation(sb.id)
            for body in ({"allowlist": None, "denylist": None}, {"allowlist": [], "denylist": []}, {"allowlist": ["ftp://x"]}):
                r = httpx.put(f"{server.url}/api/v1/sandbox/{sb.id}/egress-policy", json=body, headers=_h())
                assert r.status_code == 422, (body, r.text)
            # Another token's sandbox does not exist for B.
            r = httpx.get(f"{server.url}/api/v1/sandbox/{sb.id}/egress-policy", headers=_h(TOKEN_B))
            assert r.status_code == 404
            got = await c.get_network(sb.id)
            assert got.generation == 1 and got.applied_generation == 1
            after = await c.set_network(sb.id, deny=["*"])  # SDK: {"allowlist": [], "denylist": null}
            assert after.generation == 2 and after.applied and after.policy.allowlist == []
        finally:
            await c.delete(sb.id)
        r = httpx.put(f"{server.url}/api/v1/sandbox/{sb.id}/egress-policy", json={"allowlist": []}, headers=_h())
        assert r.status_code == 409 and "TERMINATED" in r.json()["detail"]
    finally:
        await c.aclose()


def test_whoami(server: ServerThread) -> None:
    r = httpx.get(f"{server.url}/api/v1/user/whoami", headers=_h())
    assert r.status_code == 200
    data = r.json()["data"]
    sb = SandboxClient(APIClient()).list(per_page=1)
    assert data["id"].startswith("u") and data["key_limits"]["max_concurrent_sandboxes"] == server.service.store.quota
    assert {"id", "name", "slug", "scope", "key_limits"} <= set(data)
    assert all(s.user_id == data["id"] for s in sb.sandboxes)
    assert httpx.get(f"{server.url}/api/v1/user/whoami").status_code == 401


async def test_delete_all_of_this_user(server: ServerThread) -> None:
    """`prime sandbox delete --all` sends only user_id (and all_users=false): every live
    sandbox of the token goes, another token's stay."""
    a, b = AsyncSandboxClient(), AsyncSandboxClient(api_key=TOKEN_B)
    try:
        me = httpx.get(f"{server.url}/api/v1/user/whoami", headers=_h()).json()["data"]["id"]
        mine = [await a.create(_req()) for _ in range(2)]
        theirs = await b.create(_req())
        try:
            with pytest.raises(APIError, match="403"):
                await a.bulk_delete(user_id="someone-else")
            r = httpx.request("DELETE", f"{server.url}/api/v1/sandbox", json={}, headers=_h())
            assert r.status_code == 422 and "user_id" in r.text
            res = await a.bulk_delete(user_id=me)
            assert set(res.succeeded) >= {s.id for s in mine} and res.failed == []
            assert [(await a.get(s.id)).status for s in mine] == ["TERMINATED", "TERMINATED"]
            assert (await b.get(theirs.id)).status in ("PENDING", "PROVISIONING", "RUNNING")
            assert (await a.list(exclude_terminated=True)).total == 0
            res = await b.bulk_delete(all_users=True)  # --all-users: still only this token's
            assert res.succeeded == [theirs.id]
        finally:
            for s in [*mine, theirs]:
                await (b if s is theirs else a).delete(s.id)
    finally:
        await a.aclose()
        await b.aclose()
