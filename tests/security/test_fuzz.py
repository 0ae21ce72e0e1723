"""The platform API fuzzed against its own OpenAPI schema, across tenants.

Token A creates a sandbox; schemathesis then fuzzes every operation with token B, aiming
every generated sandbox id (path parameters, the ids in bulk bodies, and the gateway's
user_ns/job_id, called with the gateway token of B's own sandbox) at A's sandbox.
Whatever B sends: no 500 (the gateway's documented 502 `sandbox_not_found` excepted), never a
2xx that shows or touches A's sandbox, and afterwards A's sandbox is RUNNING and A sees
nothing of B's. Runs on the local backend (cheap creates) and is bounded to a few seconds
per operation. (tests/platform/test_fuzz.py fuzzes one token for 500s; this one is about
tenant isolation.)
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import require

require("schemathesis")
import schemathesis
from hypothesis import HealthCheck, settings

from sandgym.platform.testing import ServerThread, serve_in_thread

TOKEN_A = "tenant-a-" + secrets.token_hex(8)
TOKEN_B = "tenant-b-" + secrets.token_hex(8)
STATE: dict[str, Any] = {}


def _wait_running(client: httpx.Client, sid: str, token: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        r = client.get(f"/api/v1/sandbox/{sid}", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        doc = r.json()
        if doc["status"] not in ("PENDING", "PROVISIONING") or time.monotonic() > deadline:
            return doc
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    require("bwrap")
    with serve_in_thread([TOKEN_A, TOKEN_B], "local", max_sandboxes=8, quota=4) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post(
                "/api/v1/sandbox",
                json={"name": "tenant-a-box", "docker_image": "sandgym/python:latest", "labels": ["owner=a"]},
                headers={"Authorization": f"Bearer {TOKEN_A}"},
            )
            assert r.status_code == 200, r.text
            sid = r.json()["id"]
            assert _wait_running(c, sid, TOKEN_A)["status"] == "RUNNING"
            auth_a = c.post(f"/api/v1/sandbox/{sid}/auth", headers={"Authorization": f"Bearer {TOKEN_A}"}).json()
            # B's own sandbox, for a gateway token of B's to aim at A's gateway paths.
            r = c.post(
                "/api/v1/sandbox",
                json={"name": "tenant-b-box", "docker_image": "sandgym/python:latest"},
                headers={"Authorization": f"Bearer {TOKEN_B}"},
            )
            assert r.status_code == 200, r.text
            b_id = r.json()["id"]
            assert _wait_running(c, b_id, TOKEN_B)["status"] == "RUNNING"
            auth_b = c.post(f"/api/v1/sandbox/{b_id}/auth", headers={"Authorization": f"Bearer {TOKEN_B}"}).json()
        STATE.update(a_id=sid, a_ns=auth_a["user_ns"], a_job=auth_a["job_id"], b_gateway_token=auth_b["token"])
        yield srv


@pytest.fixture(scope="module")
def fuzz_schema(two_tenants: ServerThread) -> Any:
    return schemathesis.openapi.from_url(f"{two_tenants.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("fuzz_schema")


def _aim_at_a(case: Any) -> bool:
    """Point the case's sandbox ids at A's sandbox; True when it now names it."""
    a_id = STATE["a_id"]
    aimed = False
    if case.path_parameters and "sandbox_id" in case.path_parameters:
        case.path_parameters["sandbox_id"] = a_id
        aimed = True
    if case.path_parameters and "job_id" in case.path_parameters:  # the gateway's paths
        case.path_parameters["job_id"] = STATE["a_job"]
        if "user_ns" in case.path_parameters:
            case.path_parameters["user_ns"] = STATE["a_ns"]
        aimed = True
    if isinstance(case.body, dict) and isinstance(case.body.get("sandbox_ids"), list):
        case.body["sandbox_ids"] = [a_id, *case.body["sandbox_ids"][:3]]
        aimed = True
    if isinstance(case.body, dict) and isinstance(case.body.get("labels"), list) and case.method == "DELETE":
        case.body["labels"] = ["owner=a"]  # A's label: a bulk delete by label must not reach A
        aimed = True
    return aimed


def _without_refusals(doc: Any) -> Any:
    # Bulk answers list the ids they refused (failed / errors): naming A's id there is fine.
    if isinstance(doc, dict):
        return {k: _without_refusals(v) for k, v in doc.items() if k not in ("failed", "errors")}
    if isinstance(doc, list):
        return [_without_refusals(v) for v in doc]
    return doc


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_token_b_never_reaches_token_a_sandbox(case: Any) -> None:
    aimed = _aim_at_a(case)
    STATE["aimed"] = STATE.get("aimed", 0) + int(aimed)
    # Gateway paths take a sandbox's gateway token: B's own sandbox's, aimed at A's sandbox.
    gateway = case.path_parameters and "job_id" in case.path_parameters
    token = STATE["b_gateway_token"] if gateway else TOKEN_B
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    code = response.status_code
    if code == 502:
        assert response.json().get("error") == "sandbox_not_found", response.text
    else:
        assert code < 500, (case.method, case.path, code, response.text)
    if 200 <= code < 300:
        try:
            doc = response.json()
        except ValueError:
            doc = response.text
        shown = json.dumps(_without_refusals(doc)) if not isinstance(doc, str) else doc
        assert STATE["a_id"] not in shown, ("token B saw A's sandbox", case.method, case.path, response.text[:500])
        assert not (aimed and case.path_parameters and ({"sandbox_id", "job_id"} & set(case.path_parameters))), (
            "token B got a 2xx on A's sandbox",
            case.method,
            case.path,
            response.text[:500],
        )


def test_token_a_sandbox_untouched_after_the_fuzz(two_tenants: ServerThread) -> None:
    """Runs after the fuzz (file order): A's sandbox is still RUNNING, still listed for A,
    its local sandbox still exists, and A's listing holds none of B's sandboxes."""
    sid = STATE["a_id"]
    assert STATE.get("aimed", 0) >= 20, f"the fuzz aimed only {STATE.get('aimed', 0)} requests at A's sandbox"
    with httpx.Client(base_url=two_tenants.url, timeout=30) as c:
        doc = _wait_running(c, sid, TOKEN_A)
        assert doc["status"] == "RUNNING", doc
        listed = c.get("/api/v1/sandbox", params={"per_page": 100}, headers={"Authorization": f"Bearer {TOKEN_A}"}).json()
        assert [s["id"] for s in listed["sandboxes"]] == [sid], listed  # and none of B's
        b_view = c.get(f"/api/v1/sandbox/{sid}", headers={"Authorization": f"Bearer {TOKEN_B}"})
        assert b_view.status_code == 404, b_view.text
    rec = two_tenants.service.store.get_any(sid)
    assert rec is not None and not rec.ended and rec.status == "RUNNING"
    b_recs = [r for r in two_tenants.service.store.all() if r.id != sid]
    assert all(r.tenant != rec.tenant for r in b_recs), "a sandbox made with B's token landed under A"
