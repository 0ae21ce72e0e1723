"""The unmodified prime-sandboxes SDK (async and sync clients) against a live `sandgym serve`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prime_sandboxes import (
    APIClient,
    APIError,
    AsyncSandboxClient,
    CommandTimeoutError,
    CreateSandboxRequest,
    SandboxClient,
    SandboxFileNotFoundError,
    SandboxImagePullError,
    UnauthorizedError,
)

from sandgym.platform.testing import ServerThread

from .conftest import IMAGE, TOKEN_A, TOKEN_B

pytestmark = pytest.mark.anyio


def _req(label: str = "", **kw: object) -> CreateSandboxRequest:
    return CreateSandboxRequest(
        name=f"t-{uuid.uuid4().hex[:6]}",
        docker_image=IMAGE,
        cpu_cores=0.5,
        memory_gb=0.5,
        disk_size_gb=0.25,
        timeout_minutes=10,
        labels=[label] if label else [],
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
async def client(server: ServerThread) -> AsyncIterator[AsyncSandboxClient]:
    c = AsyncSandboxClient()
    assert c.client.base_url == server.url  # found through PRIME_API_BASE_URL
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
async def sandbox_id(client: AsyncSandboxClient) -> AsyncIterator[str]:
    sb = await client.create(_req(environment_vars={"FROM_CREATE": "yes"}))
    try:
        await client.wait_for_creation(sb.id)
        yield sb.id
    finally:
        await client.delete(sb.id)


async def test_create_wait_exec_env_cwd_stderr_exit(client: AsyncSandboxClient) -> None:
    sb = await client.create(_req(environment_vars={"FROM_CREATE": "yes"}))
    try:
        assert sb.status in ("PENDING", "PROVISIONING", "RUNNING") and sb.docker_image == IMAGE
        assert sb.memory_gb == 0.5 and sb.timeout_minutes == 10
        await client.wait_for_creation(sb.id)
        assert (await client.get(sb.id)).status == "RUNNING"
        r = await client.execute_command(
            sb.id, 'echo "$FROM_CREATE $FROM_CALL"; pwd; echo oops >&2; exit 7', working_dir="/tmp", env={"FROM_CALL": "c"}
        )
        assert (r.stdout, r.stderr, r.exit_code) == ("yes c\n/tmp\n", "oops\n", 7)
        r = await client.execute_command(sb.id, "id -u; python3 -c 'print(6*7)'")
        uid, answer = r.stdout.split()
        assert uid != "0" and answer == "42" and r.exit_code == 0
        logs = await client.get_logs(sb.id)
        assert "status RUNNING" in logs and "exit=7" in logs
    finally:
        await client.delete(sb.id)
    gone = await client.get(sb.id)
    assert gone.status == "TERMINATED" and gone.terminated_at is not None
    await client.delete(sb.id)  # deleting twice is fine (verifiers does)


async def test_command_timeout(client: AsyncSandboxClient, sandbox_id: str) -> None:
    with pytest.raises(CommandTimeoutError):
        await client.execute_command(sandbox_id, "sleep 30; echo late", timeout=2)
    # The sandbox is still usable and the sleeper is gone.
    r = await client.execute_command(sandbox_id, "ps -eo args | grep -c '^sleep 30' || true")
    assert r.stdout.strip() == "0"


async def test_files_upload_read_download_missing(client: AsyncSandboxClient, sandbox_id: str, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("hello file\n")
    up = await client.upload_file(sandbox_id, "/workspace/deep/dir/in.txt", str(src))
    assert up.success and up.size == len("hello file\n")
    blob = bytes(range(256)) * 4
    await client.upload_bytes(sandbox_id, "/workspace/blob.bin", blob, "blob.bin")
    r = await client.execute_command(sandbox_id, "cat deep/dir/in.txt; wc -c < blob.bin", working_dir="/workspace")
    assert r.stdout == "hello file\n1024\n"
    rf = await client.read_file(sandbox_id, "/workspace/deep/dir/in.txt")
    assert rf.content == "hello file\n" and rf.size == 11
    tail = await client.read_file(sandbox_id, "/workspace/deep/dir/in.txt", offset=-5, length=5)
    assert tail.content == "file\n" and tail.truncated and tail.total_size == 11
    out = tmp_path / "back" / "blob.bin"
    await client.download_file(sandbox_id, "/workspace/blob.bin", str(out))
    assert out.read_bytes() == blob
    with pytest.raises(SandboxFileNotFoundError):
        await client.read_file(sandbox_id, "/workspace/nope.txt")
    with pytest.raises(APIError, match="404"):
        await client.download_file(sandbox_id, "/workspace/nope.txt", str(tmp_path / "x"))


def _needs_detached_processes(server: ServerThread) -> None:
    if server.service.manager.provider.name == "local":
        pytest.skip("the local provider (bwrap) kills what a command leaves running, so nothing outlives its exec")


async def test_background_job(server: ServerThread, client: AsyncSandboxClient, sandbox_id: str) -> None:
    _needs_detached_processes(server)
    job = await client.start_background_job(sandbox_id, "sleep 1; echo done; echo warn >&2; exit 4", working_dir="/workspace")
    first = await client.get_background_job(sandbox_id, job)
    assert not first.completed
    status = first
    for _ in range(60):
        status = await client.get_background_job(sandbox_id, job)
        if status.completed:
            break
        await asyncio.sleep(0.5)
    assert status.completed and status.exit_code == 4
    assert status.stdout == "done\n" and status.stderr == "warn\n"
    # run_background_job: start, poll and collect in one call.
    done = await client.run_background_job(sandbox_id, "echo $((2+3))", timeout=60)
    assert done.exit_code == 0 and done.stdout == "5\n"


async def test_list_by_label_bulk_delete_and_batch_status(client: AsyncSandboxClient) -> None:
    label = f"grp-{uuid.uuid4().hex[:6]}"
    made = [await client.create(_req(label)) for _ in range(2)]
    other = await client.create(_req())
    ids = [s.id for s in made]
    try:
        await client.bulk_wait_for_creation(ids + [other.id])
        listed = await client.list(labels=[label])
        assert sorted(s.id for s in listed.sandboxes) == sorted(ids) and listed.total == 2
        page = await client.list(per_page=1, page=1, exclude_terminated=True)
        assert len(page.sandboxes) == 1 and page.has_next
        statuses = await client.get_sandbox_statuses(ids + ["sb-not-mine"])
        assert {s.sandbox_id: s.status for s in statuses.statuses} == dict.fromkeys(ids, "RUNNING")
        assert [e.code for e in statuses.errors] == ["NOT_FOUND"]
        res = await client.bulk_delete(labels=[label])
        assert sorted(res.succeeded) == sorted(ids) and res.failed == []
        for sid in ids:
            assert (await client.get(sid)).status == "TERMINATED"
        assert (await client.get(other.id)).status == "RUNNING"
        res = await client.bulk_delete(sandbox_ids=[other.id, "sb-unknown"])
        assert res.succeeded == [other.id] and res.failed[0]["sandbox_id"] == "sb-unknown"
        active = await client.list(labels=[label], exclude_terminated=True)
        assert active.total == 0
    finally:
        for sid in ids + [other.id]:
            await client.delete(sid)


async def test_tokens_cannot_see_each_other(
    server: ServerThread, client: AsyncSandboxClient, sandbox_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another user has another HOME: the SDK shares gateway tokens through ~/.prime.
    with monkeypatch.context() as m:
        m.setenv("HOME", str(tmp_path))
        other = AsyncSandboxClient(api_key=TOKEN_B)
    try:
        for call in (other.get(sandbox_id), other.delete(sandbox_id), other.execute_command(sandbox_id, "true")):
            with pytest.raises(APIError, match="404"):
                await call
        assert sandbox_id not in {s.id for s in (await other.list()).sandboxes}
        res = await other.bulk_delete(sandbox_ids=[sandbox_id])
        assert res.succeeded == []
        # B's gateway token (for B's own sandbox) does not open A's sandbox either.
        mine = await other.create(_req())
        try:
            auth_b = httpx.post(f"{server.url}/api/v1/sandbox/{mine.id}/auth", headers={"Authorization": f"Bearer {TOKEN_B}"}).json()
            url = f"{auth_b['gateway_url']}/{auth_b['user_ns']}/{sandbox_id}/read-file"
            r = httpx.get(url, params={"path": "/etc/hostname"}, headers={"Authorization": f"Bearer {auth_b['token']}"})
            assert r.status_code in (401, 502)
        finally:
            await other.delete(mine.id)
    finally:
        await other.aclose()
    assert (await client.get(sandbox_id)).status == "RUNNING"


async def test_fifty_concurrent_execs(client: AsyncSandboxClient) -> None:
    sbs = [await client.create(_req()) for _ in range(2)]
    try:
        await client.bulk_wait_for_creation([s.id for s in sbs])
        results = await asyncio.gather(
            *(client.execute_command(sbs[i % 2].id, f"echo {i}; echo e{i} >&2; exit $(({i} % 5))") for i in range(50))
        )
        for i, r in enumerate(results):
            assert (r.stdout, r.stderr, r.exit_code) == (f"{i}\n", f"e{i}\n", i % 5)
    finally:
        for s in sbs:
            await client.delete(s.id)


async def test_unknown_image_fails_creation(server: ServerThread, client: AsyncSandboxClient) -> None:
    if server.service.manager.provider.name == "local":
        pytest.skip("the local provider runs no images")
    sb = await client.create(CreateSandboxRequest(name="bad", docker_image="no/such-image:0", memory_gb=0.5, disk_size_gb=0.25))
    try:
        with pytest.raises(SandboxImagePullError):
            await client.wait_for_creation(sb.id)
        got = await client.get(sb.id)
        assert got.status == "ERROR" and got.error_type == "IMAGE_PULL_FAILED" and got.error_message
    finally:
        await client.delete(sb.id)


async def test_idempotent_create(client: AsyncSandboxClient) -> None:
    key = uuid.uuid4().hex
    a = await client.create(_req(idempotency_key=key))
    try:
        b = await client.create(_req(idempotency_key=key))
        assert a.id == b.id
    finally:
        await client.delete(a.id)


async def test_live_process_stdin_and_signal(server: ServerThread, client: AsyncSandboxClient, sandbox_id: str) -> None:
    _needs_detached_processes(server)
    proc = await client.open_process(sandbox_id, "while read line; do echo got:$line; done")
    try:
        assert proc.pid > 0
        await proc.write_stdin(b"alpha\n")
        await proc.write_stdin(b"beta\n")
        seen = b""
        async for chunk in proc.stdout:
            seen += chunk
            if seen.count(b"\n") >= 2:
                break
        assert seen == b"got:alpha\ngot:beta\n"
        rec = server.service.store.get_any(sandbox_id)
        assert rec is not None and rec.sessions is not None
        kinds = {type(s.process).__name__ for s in rec.sessions.running()}
        want = "ExecdLiveProcess" if server.service.manager.provider.name == "docker" else "ShellLiveProcess"
        assert kinds == {want}
        await proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 20) == 143
    finally:
        await proc.aclose()
    quick = await client.open_process(sandbox_id, "echo fast; exit 5")
    try:
        assert await asyncio.wait_for(quick.wait(), 20) == 5
    finally:
        await quick.aclose()


def test_sync_client(server: ServerThread, tmp_path: Path) -> None:
    c = SandboxClient(APIClient())
    sb = c.create(_req())
    try:
        c.wait_for_creation(sb.id)
        r = c.execute_command(sb.id, "echo sync; exit 2", env={"A": "1"})
        assert (r.stdout, r.exit_code) == ("sync\n", 2)
        c.upload_bytes(sb.id, "/workspace/s.txt", b"sync file", "s.txt")
        assert c.read_file(sb.id, "/workspace/s.txt").content == "sync file"
        with pytest.raises(CommandTimeoutError):
            c.execute_command(sb.id, "sleep 20", timeout=1)
    finally:
        c.delete(sb.id)
    assert c.get(sb.id).status == "TERMINATED"


# ---- raw HTTP: auth, quota, validation, docs, unsupported endpoints ----------------------


def _h(token: str = TOKEN_A) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_401_without_or_with_a_wrong_token(server: ServerThread) -> None:
    assert httpx.get(f"{server.url}/api/v1/sandbox").status_code == 401
    assert httpx.get(f"{server.url}/api/v1/sandbox", headers=_h("wrong")).status_code == 401
    with pytest.raises(UnauthorizedError):
        SandboxClient(APIClient(api_key="wrong")).list()


def test_422_names_the_field(server: ServerThread) -> None:
    cases = [
        ({"name": "x", "docker_image": IMAGE, "cpu_cores": -1}, "cpu_cores"),
        ({"name": "x", "docker_image": IMAGE, "cpu_cores": 4096}, "cpu_cores"),
        ({"name": "x", "docker_image": IMAGE, "memory_gb": "lots"}, "memory_gb"),
        ({"name": "x", "docker_image": IMAGE, "timeout_minutes": 0}, "timeout_minutes"),
        ({"name": "x", "docker_image": IMAGE, "environment_vars": {"1BAD": "v"}}, "environment_vars"),
        ({"name": "x", "docker_image": IMAGE, "volumes": [{"name": "v", "mount_path": "/v"}]}, "volumes"),
        ({"docker_image": IMAGE}, "name"),
    ]
    for body, field in cases:
        r = httpx.post(f"{server.url}/api/v1/sandbox", json=body, headers=_h())
        assert r.status_code == 422, (body, r.text)
        assert any(field in map(str, e["loc"]) for e in r.json()["detail"]), (field, r.json())
    r = httpx.post(f"{server.url}/api/v1/sandbox", content=b"{not json", headers={**_h(), "content-type": "application/json"})
    assert r.status_code == 422
    r = httpx.get(f"{server.url}/api/v1/sandbox", params={"per_page": 0}, headers=_h())
    assert r.status_code == 422 and "per_page" in r.text
    r = httpx.post(f"{server.url}/api/v1/sandbox/status:batchGet", json={"sandbox_ids": []}, headers=_h())
    assert r.status_code == 422 and "sandbox_ids" in r.text


def test_quota_429(server: ServerThread) -> None:
    quota = server.service.store.quota
    made = []
    try:
        while True:
            r = httpx.post(f"{server.url}/api/v1/sandbox", json={"name": "q", "docker_image": IMAGE, "memory_gb": 0.5, "disk_size_gb": 0.25}, headers=_h(TOKEN_B))
            if r.status_code == 429:
                break
            assert r.status_code == 200, r.text
            made.append(r.json()["id"])
            assert len(made) <= quota
        assert len(made) == quota and "quota" in r.json()["detail"]
        # The other token is not affected by B's quota.
        ok = httpx.get(f"{server.url}/api/v1/sandbox", headers=_h(TOKEN_A))
        assert ok.status_code == 200
    finally:
        for sid in made:
            httpx.delete(f"{server.url}/api/v1/sandbox/{sid}", headers=_h(TOKEN_B))


def test_docs_and_unsupported_endpoints_404(server: ServerThread) -> None:
    assert httpx.get(f"{server.url}/docs").status_code == 200
    spec = httpx.get(f"{server.url}/openapi.json").json()
    assert "/api/v1/sandbox" in spec["paths"] and "/api/v1/sandbox/{sandbox_id}/auth" in spec["paths"]
    for method, path in [
        ("POST", "/api/v1/sandbox/sbx/checkpoints"),
        ("GET", "/api/v1/sandbox/checkpoints/c1"),
        ("POST", "/api/v1/sandbox/networks"),
        ("GET", "/api/v1/sandbox/volumes/v1"),
        ("POST", "/api/v1/sandbox/background-jobs/status:batchGet"),
        ("GET", "/api/v1/images"),
        ("POST", "/api/v1/sandbox/sbx/ssh-session"),
    ]:
        r = httpx.request(method, f"{server.url}{path}", headers=_h(), json={})
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert "detail" in r.json()
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
