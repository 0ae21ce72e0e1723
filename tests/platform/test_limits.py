"""Refusals come first and say why: 413 for bodies past the limit, 422 for an environment a
process could not be given or too little memory -- each before anything is created -- and
output past the limit is flagged wherever it surfaces."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

from sandgym.platform.models import MAX_ENV_ENTRY_BYTES, MAX_ENV_VARS
from sandgym.platform.testing import ServerThread, serve_in_thread
from sandgym.sandboxes.ownership import new_run_id, owner_labels
from sandgym.sandboxes.spec import SandboxSpec

from .conftest import IMAGE, backend

TOKEN = "limits-token"
OUTPUT_LIMIT = 4096

@pytest.fixture(scope="module")
def small(isolated_home: str) -> Iterator[ServerThread]:
    with serve_in_thread(
        [TOKEN], backend(), max_sandboxes=2, max_body_bytes=1 << 20, max_upload_bytes=256 << 10,
        output_limit_bytes=OUTPUT_LIMIT,
    ) as srv:
        yield srv

def _h() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}

def _client(srv: ServerThread) -> SandboxClient:
    api = APIClient(api_key=TOKEN)
    api.base_url = srv.url
    return SandboxClient(api)

def _total(srv: ServerThread) -> int:
    return int(httpx.get(f"{srv.url}/api/v1/sandbox", headers=_h()).json()["total"])

def test_413_for_oversized_bodies(small: ServerThread) -> None:
    big = b'{"name": "x", "docker_image": "' + b"a" * (2 << 20) + b'"}'
    r = httpx.post(f"{small.url}/api/v1/sandbox", content=big, headers={**_h(), "content-type": "application/json"})
    assert r.status_code == 413 and str(1 << 20) in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no content-length: counted as it streams
        yield b'{"name": "x", "docker_image": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'

    r = httpx.post(f"{small.url}/api/v1/sandbox", content=chunks(), headers={**_h(), "content-type": "application/json"})
    assert r.status_code == 413
    assert _total(small) == 0
    # Uploads have their own limit.
    c = _client(small)
    sb = c.create(CreateSandboxRequest(name="up", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
    try:
        c.wait_for_creation(sb.id)
        c.upload_bytes(sb.id, "/workspace/ok.bin", os.urandom(200 << 10), "ok.bin")
        auth = httpx.post(f"{small.url}/api/v1/sandbox/{sb.id}/auth", headers=_h()).json()
        url = f"{auth['gateway_url']}/{auth['user_ns']}/{auth['job_id']}/upload"
        r = httpx.post(url, params={"path": "/workspace/big.bin"}, files={"file": ("big.bin", b"x" * (300 << 10))},
                       headers={"Authorization": f"Bearer {auth['token']}"})
        assert r.status_code == 413, r.text
        assert c.execute_command(sb.id, "ls /workspace").stdout.split() == ["ok.bin"]
    finally:
        c.delete(sb.id)

def test_422_for_an_environment_no_process_could_get(small: ServerThread) -> None:
    before = _total(small)
    base = {"name": "env", "docker_image": IMAGE}
    cases = [
        ({"environment_vars": {"BIG": "x" * (MAX_ENV_ENTRY_BYTES + 1)}}, str(MAX_ENV_ENTRY_BYTES)),
        ({"environment_vars": {f"V{i}": "1" for i in range(MAX_ENV_VARS + 1)}}, str(MAX_ENV_VARS)),
        ({"environment_vars": {"OK": "1"}, "secrets": {"BAD-NAME": "1"}}, "not a valid environment variable name"),
    ]
    for extra, words in cases:
        r = httpx.post(f"{small.url}/api/v1/sandbox", json={**base, **extra}, headers=_h(), timeout=60)
        assert r.status_code == 422, r.text[:300]
        msgs = " ".join(e["msg"] for e in r.json()["detail"])
        assert words in msgs, msgs[:300]
    # The issue's own sizes (a 10 MB value, 50,000 variables) are refused by the body limit of
    # this server (413) or, under the default 16 MiB limit, by the checks above (422).
    r = httpx.post(f"{small.url}/api/v1/sandbox", json={**base, "environment_vars": {"V": "x" * 10_000_000}}, headers=_h())
    assert r.status_code == 413
    assert _total(small) == before

def test_the_issue_sizes_get_422_under_the_default_body_limit(server: ServerThread) -> None:
    h = {"Authorization": f"Bearer {server.config.tokens[0]}"}
    before = httpx.get(f"{server.url}/api/v1/sandbox", headers=h).json()["total"]
    for extra, words in (
        ({"environment_vars": {"V": "x" * 10_000_000}}, "bytes per variable"),
        ({"environment_vars": {f"V{i}": "1" for i in range(50_000)}}, f"at most {MAX_ENV_VARS}"),
        # each variable fits, all of them together do not
        ({"environment_vars": {"A": "y"}, "secrets": {f"S{i}": "y" * 100_000 for i in range(11)}}, "in all"),
    ):
        r = httpx.post(f"{server.url}/api/v1/sandbox", json={"name": "e", "docker_image": IMAGE, **extra},
                       headers=h, timeout=60)
        assert r.status_code == 422 and words in r.text, r.text[:300]
    assert httpx.get(f"{server.url}/api/v1/sandbox", headers=h).json()["total"] == before

def test_422_for_too_little_memory(small: ServerThread) -> None:
    before = _total(small)
    r = httpx.post(f"{small.url}/api/v1/sandbox", json={"name": "m", "docker_image": IMAGE, "memory_gb": 0.001}, headers=_h())
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "memory_gb"] and "minimum" in err["msg"] and "16 MiB" in err["msg"]
    assert _total(small) == before

def test_truncated_output_is_flagged(small: ServerThread) -> None:
    c = _client(small)
    sb = c.create(CreateSandboxRequest(name="tr", docker_image=IMAGE, memory_gb=0.5, disk_size_gb=0.25))
    try:
        c.wait_for_creation(sb.id)
        r = c.execute_command(sb.id, f"head -c {3 * OUTPUT_LIMIT} /dev/zero | tr '\\0' a; echo done >&2")
        assert r.exit_code == 0 and r.stdout == "a" * OUTPUT_LIMIT
        assert r.stderr.startswith("done\n") and "output truncated" in r.stderr and str(OUTPUT_LIMIT) in r.stderr
        short = c.execute_command(sb.id, "echo short")
        assert short.stdout == "short\n" and short.stderr == ""
        assert "output truncated" in c.get_logs(sb.id)
    finally:
        c.delete(sb.id)

@pytest.mark.anyio
async def test_prime_provider_reports_server_side_truncation(small: ServerThread) -> None:
    """The server's limit (4 KiB) is below the provider's own (1 MiB): the end event says so
    and ExecResult.truncated is set, with stderr left as the command wrote it."""
    from sandgym.sandboxes.providers.prime import PrimeProvider

    provider = PrimeProvider(endpoints=[small.url], api_key=TOKEN, state_dir=os.environ["HOME"])
    try:
        sb = await provider.create(SandboxSpec(memory_mb=512, exec_timeout_s=60), owner_labels(new_run_id()))
        try:
            r = await sb.exec(f"head -c {2 * OUTPUT_LIMIT} /dev/zero; echo err >&2")
            assert r.truncated and len(r.stdout_bytes) == OUTPUT_LIMIT and r.stderr == "err\n"
            assert not (await sb.exec("echo fine")).truncated
        finally:
            await sb.close()
    finally:
        await provider.aclose()
