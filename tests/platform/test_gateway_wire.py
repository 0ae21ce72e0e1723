"""The gateway at the wire: Connect framing, server-side deadlines, token expiry and rotation."""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prime_sandboxes import APIClient, APIError, CreateSandboxRequest, SandboxClient
from prime_sandboxes._proto.command_session import command_session_pb2 as pb

from sandgym.platform.store import token_hash
from sandgym.platform.testing import ServerThread, serve_in_thread

from .conftest import IMAGE, TOKEN_A, backend


def _frames(body: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos < len(body):
        flags, size = struct.unpack(">BI", body[pos : pos + 5])
        out.append((flags, body[pos + 5 : pos + 5 + size]))
        pos += 5 + size
    return out


def _start(cmd: str) -> bytes:
    req = pb.StartRequest(command=pb.CommandSpec(cmd="/bin/bash", args=["-c", cmd]))
    data = req.SerializeToString()
    return struct.pack(">BI", 0, len(data)) + data


@pytest.fixture(scope="module")
def sandbox(server: ServerThread) -> Iterator[tuple[SandboxClient, str]]:
    c = SandboxClient(APIClient())
    sb = c.create(CreateSandboxRequest(name=f"w-{uuid.uuid4().hex[:6]}", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
    try:
        c.wait_for_creation(sb.id)
        yield c, sb.id
    finally:
        c.delete(sb.id)


def _auth(server: ServerThread, sid: str) -> dict[str, str]:
    r = httpx.post(f"{server.url}/api/v1/sandbox/{sid}/auth", headers={"Authorization": f"Bearer {TOKEN_A}"})
    assert r.status_code == 200
    return r.json()


def _rpc_url(auth: dict[str, str], method: str = "Start") -> str:
    return f"{auth['gateway_url']}/{auth['user_ns']}/{auth['job_id']}/command_session.CommandSession/{method}"


def test_connect_stream_framing_and_server_deadline(server: ServerThread, sandbox: tuple[SandboxClient, str]) -> None:
    auth = _auth(server, sandbox[1])
    headers = {"Authorization": f"Bearer {auth['token']}", "Content-Type": "application/connect+proto", "connect-protocol-version": "1"}
    r = httpx.post(_rpc_url(auth), content=_start("printf hi; exit 3"), headers={**headers, "connect-timeout-ms": "30000"}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/connect+proto"
    frames = _frames(r.content)
    assert frames[-1] == (2, b"{}")
    events = [pb.StartResponse.FromString(d).event for f, d in frames[:-1]]
    assert [e.WhichOneof("event") for e in events] == ["start", "data", "end"]
    assert events[1].data.stdout == b"hi" and events[2].end.exit_code == 3
    # The server enforces connect-timeout-ms itself (the client here would wait 60 s).
    t0 = time.monotonic()
    r = httpx.post(_rpc_url(auth), content=_start("sleep 30"), headers={**headers, "connect-timeout-ms": "1000"}, timeout=60)
    assert time.monotonic() - t0 < 15
    flags, data = _frames(r.content)[-1]
    assert flags == 2 and json.loads(data)["error"]["code"] == "deadline_exceeded"


def test_connect_bad_input_is_not_a_500(server: ServerThread, sandbox: tuple[SandboxClient, str]) -> None:
    auth = _auth(server, sandbox[1])
    h = {"Authorization": f"Bearer {auth['token']}", "connect-protocol-version": "1"}
    r = httpx.post(_rpc_url(auth), content=b"\x00\x00\x00\x00\x09garbage!!", headers={**h, "Content-Type": "application/connect+proto"})
    assert r.status_code == 200 and json.loads(_frames(r.content)[-1][1])["error"]["code"] == "invalid_argument"
    r = httpx.post(_rpc_url(auth, "SendInput"), content=b"\xff\xff", headers={**h, "Content-Type": "application/proto"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    r = httpx.post(_rpc_url(auth, "Update"), content=b"", headers={**h, "Content-Type": "application/proto"})
    assert r.status_code == 501 and r.json()["code"] == "unimplemented"
    r = httpx.post(_rpc_url(auth, "SendSignal"), content=b"", headers={**h, "Content-Type": "application/proto"})
    assert r.status_code == 404 and r.json()["code"] == "not_found"  # no such session
    # A content type Connect does not define: 415, naming the ones it takes (Connect spec).
    r = httpx.post(_rpc_url(auth), content=_start("true"), headers={**h, "Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/connect+proto" in r.headers["accept-post"], r.text
    r = httpx.post(_rpc_url(auth, "SendInput"), content=b"", headers={**h, "Content-Type": "application/xml"})
    assert r.status_code == 415 and "application/proto" in r.json()["message"]
    base = f"{auth['gateway_url']}/{auth['user_ns']}/{auth['job_id']}"
    r = httpx.get(f"{base}/read-file", params={"path": "/etc/hostname", "offset": "x"}, headers={"Authorization": f"Bearer {auth['token']}"})
    assert r.status_code == 422 and "offset" in r.text
    r = httpx.post(f"{base}/upload", params={"path": "/workspace/x"}, headers={"Authorization": f"Bearer {auth['token']}"})
    assert r.status_code == 422 and "file" in r.text


def test_file_call_the_sandbox_cannot_do_is_400_naming_the_call(server: ServerThread, sandbox: tuple[SandboxClient, str]) -> None:
    auth = _auth(server, sandbox[1])
    base = f"{auth['gateway_url']}/{auth['user_ns']}/{auth['job_id']}"
    h = {"Authorization": f"Bearer {auth['token']}"}
    sandbox[0].execute_command(sandbox[1], "mkdir -p /workspace/adir")
    r = httpx.get(f"{base}/read-file", params={"path": "/workspace/adir"}, headers=h)
    assert r.status_code == 400 and r.json()["error"] == "read_failed", r.text
    r = httpx.get(f"{base}/download", params={"path": "/workspace/adir"}, headers=h)
    assert r.status_code == 400 and r.json()["error"] == "read_failed", r.text
    r = httpx.post(f"{base}/upload", params={"path": "/workspace/adir"}, files={"file": ("f", b"x")}, headers=h)
    assert r.status_code == 400 and r.json()["error"] == "upload_failed", r.text
    assert sandbox[0].execute_command(sandbox[1], "test -d /workspace/adir && echo dir").stdout == "dir\n"


def test_rotated_gateway_token_is_recovered_by_the_sdk(server: ServerThread, sandbox: tuple[SandboxClient, str]) -> None:
    c, sid = sandbox
    assert c.execute_command(sid, "echo before").stdout == "before\n"  # caches a gateway token
    rec = server.service.store.get_any(sid)
    assert rec is not None
    rec.gw_token = "rotated-" + uuid.uuid4().hex  # the cached token is stale
    rec.gw_hash, rec.gw_prev = token_hash(rec.gw_token), ("", 0.0)
    # The SDK gets `unauthenticated`, re-authenticates once and retries.
    assert c.execute_command(sid, "echo after").stdout == "after\n"
    assert c.read_file(sid, "/etc/hostname").size > 0


def test_expired_gateway_token_gets_401(isolated_home: str) -> None:
    with serve_in_thread(["tok"], backend(), gateway_token_ttl_s=3.0) as srv:
        api = APIClient(api_key="tok")
        api.base_url = srv.url
        c = SandboxClient(api)
        sb = c.create(CreateSandboxRequest(name="exp", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
        try:
            c.wait_for_creation(sb.id)
            auth = httpx.post(f"{srv.url}/api/v1/sandbox/{sb.id}/auth", headers={"Authorization": "Bearer tok"}).json()
            url = f"{auth['gateway_url']}/{auth['user_ns']}/{auth['job_id']}/read-file"
            h = {"Authorization": f"Bearer {auth['token']}"}
            assert httpx.get(url, params={"path": "/etc/hostname"}, headers=h).status_code == 200
            time.sleep(3.2)
            assert httpx.get(url, params={"path": "/etc/hostname"}, headers=h).status_code == 401
            # The SDK refreshes such short-lived tokens before every call and keeps working.
            assert c.execute_command(sb.id, "echo ok").stdout == "ok\n"
        finally:
            c.delete(sb.id)


def test_exec_user(sandbox: tuple[SandboxClient, str]) -> None:
    c, sid = sandbox
    assert c.execute_command(sid, "id -un", user="sandbox").stdout == "sandbox\n"
    with pytest.raises(APIError, match="invalid_argument"):
        c.execute_command(sid, "id -u", user="root")
