"""The viewer's safe defaults, over real HTTP: files only from inside the run folders, the
Host header checked, a token required off loopback (and honoured when given), and headers
that keep the page to its own scripts."""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path

import pytest

from .conftest import Runs, Viewer, sandgym

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]  # the first test makes the run folders (minutes on a busy machine)


def get(base: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def test_files_only_from_inside_the_run(viewer: Viewer, runs: Runs) -> None:
    run = "run=0/swe-debug"
    ok, _, body = get(viewer.base, f"/api/file?{run}&path=slugger__collapse-runs/applied.diff")
    assert ok == 200 and "diff --git" in json.loads(body)["value"]
    secret = runs.path("swe-debug").parent.parent / "secret.txt"
    secret.write_text("not for the browser")
    for name, target in (("escape.log", secret), ("passwd.log", Path("/etc/passwd"))):
        link = runs.path("swe-debug") / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    for bad in ("../secret.txt", "..%2Fsecret.txt", "slugger__collapse-runs/../../secret.txt", "/etc/passwd",
                "%2Fetc%2Fpasswd", "escape.log", "passwd.log", "slugger__collapse-runs/..", "a%00b", "..\\secret.txt"):
        status, _, body = get(viewer.base, f"/api/file?{run}&path={bad}")
        assert status == 403, (bad, status, body)
        assert b"not for the browser" not in body and b"root:" not in body
    assert get(viewer.base, f"/api/file?{run}&path=nope.log")[0] == 404
    for path in ("/api/run?id=0/..", "/api/run?id=0/../..", "/api/run?id=/etc", "/api/rollouts?run=0/../view-runs0"):
        assert get(viewer.base, path)[0] == 404, path
    for path in ("/static/../app.py", "/static/..%2Fapp.py", "/static/%2e%2e/%2e%2e/runs.py"):
        status, _, body = get(viewer.base, path)
        assert status == 404 and b"import" not in body, path


def test_host_header_and_page_headers(viewer: Viewer) -> None:
    assert get(viewer.base, "/api/runs", {"Host": "attacker.example"})[0] == 421  # DNS rebinding
    assert get(viewer.base, "/api/runs", {"Host": "localhost"})[0] == 200
    status, headers, body = get(viewer.base, "/")
    assert status == 200 and b"/static/js/main.js" in body
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe" not in csp and "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff"


def test_non_loopback_bind_needs_a_token(runs: Runs) -> None:
    p = sandgym("view", str(runs.root), "--host", "0.0.0.0", "--port", "0", "--no-open", timeout=60)
    assert p.returncode == 2 and "--token" in p.stderr and "not a loopback address" in p.stderr
    v = Viewer(runs.root, extra=("--host", "0.0.0.0", "--token", "s3cret"))
    try:
        assert v.url.endswith("/?token=s3cret")
        base = v.base.replace("0.0.0.0", "127.0.0.1")
        assert get(base, "/api/runs")[0] == 401
        assert get(base, "/")[0] == 401
        assert get(base, "/api/runs", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(base, "/api/runs", {"Authorization": "Bearer s3cret"})[0] == 200
        status, headers, _ = get(base, "/?token=s3cret")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert get(base, "/api/runs", {"Cookie": cookie.split(";")[0]})[0] == 200
    finally:
        v.close()


def test_a_loopback_server_takes_a_token_too(runs: Runs) -> None:
    v = Viewer(runs.root, extra=("--token", "auto"))
    try:
        token = v.url.split("?token=")[1]
        assert len(token) >= 24
        assert get(v.base, "/api/runs")[0] == 401
        assert get(v.base, "/api/runs", {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        v.close()


def test_missing_folder_is_one_line(tmp_path: Path) -> None:
    p = sandgym("view", str(tmp_path / "nope"), "--no-open", timeout=60)
    assert p.returncode == 2 and "not a folder" in p.stderr and "Traceback" not in p.stderr
    assert os.path.basename(str(tmp_path / "nope")) in p.stderr
