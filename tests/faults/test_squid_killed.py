"""The egress proxy (squid) SIGKILLed in the middle of a download through it.

Three sandboxes with an allow-list (the host's loopback service, as host.sandgym.internal)
hold acknowledged writes; one of them is downloading a large file, slowly, when squid is
killed. Asserted: the interrupted download fails where the program can see it (never a
short file reported complete); the next connection through the proxy starts squid again,
and every sandbox downloads in full with the right digest; the allow-list still holds after
the restart (a destination not on it is refused) and the egress log still records; every
acknowledged write reads back; once the provider closes, no squid and no sandbox is left.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from sandgym.sandboxes.ownership import owner_labels
from sandgym.sandboxes.providers.docker import DockerProvider, DockerSandbox
from sandgym.sandboxes.spec import EgressPolicy, SandboxSpec
from tests.sandboxes.test_egress import egress_log_of

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker", "egress")]

RUN = uuid.uuid4().hex[:12]
LABELS = {**owner_labels("test-squid-killed"), "sandgym.run": RUN}
ALIAS = "host.sandgym.internal"
BIG = 8 << 20  # bytes of the slow download
CHUNK = 64 << 10
N = 3

# Downloads argv[1] through the proxy the sandbox is given; prints the length and digest.
# A connection cut mid-body reaches the program as an early end of the stream: like curl or
# urllib3, it checks the length (http.client's read(n) itself does not).
FETCH = """\
import hashlib, sys, urllib.request
h, n = hashlib.sha256(), 0
with urllib.request.urlopen(sys.argv[1], timeout=60) as r:
    want = int(r.headers["Content-Length"])
    while chunk := r.read(65536):
        h.update(chunk); n += len(chunk)
if n != want:
    sys.exit(f"short read: {n} of {want} bytes")
print(n, h.hexdigest())
"""


def _payload(n: int) -> bytes:
    return (b"sandgym-egress-" * (n // 15 + 1))[:n]


class _Server(http.server.ThreadingHTTPServer):
    sent = 0  # bytes of /big sent so far


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        body = _payload(BIG if self.path == "/big" else 1000)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for i in range(0, len(body), CHUNK):
                self.wfile.write(body[i:i + CHUNK])
                if self.path == "/big":
                    self.server.sent += CHUNK
                    time.sleep(0.02)  # slow enough to be killed in the middle
        except OSError:
            pass  # the proxy went away

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def host_service() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def state_root() -> Iterator[Path]:
    # Not under pytest's tmp_path (0700): squid runs as its own user and must get in.
    d = Path(tempfile.mkdtemp(prefix="sandgym-squid-killed-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def provider(host_service: _Server, state_root: Path) -> AsyncIterator[DockerProvider]:
    p = DockerProvider(egress_host_ports=[int(host_service.server_address[1])], state_root=state_root)
    try:
        yield p
    finally:
        for info in await p.list({"sandgym.run": RUN}):
            await p.remove(info.id)
        await p.aclose()


def _squid_pids(state_root: Path) -> list[int]:
    """squid processes (not their watchdog or helpers) whose config is under `state_root`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"squid" and any(str(state_root).encode() in a for a in argv):
            found.append(int(entry))
    return found


async def _fetch(sb: DockerSandbox, url: str) -> tuple[int, str, str]:
    r = await sb.exec(["python3", "/tmp/fetch.py", url], timeout=120)
    return r.exit_code, r.stdout.strip(), r.stderr.strip()[-300:]


async def test_squid_killed_mid_download(provider: DockerProvider, host_service: _Server, state_root: Path) -> None:
    port = int(host_service.server_address[1])
    big, small = f"http://{ALIAS}:{port}/big", f"http://{ALIAS}:{port}/small"
    spec = SandboxSpec(memory_mb=256, disk_mb=64, ttl_s=900, network=True, egress=EgressPolicy(allow=[ALIAS]))
    boxes = [await provider.create(spec, LABELS) for _ in range(N)]
    written = {}
    for sb in boxes:
        await sb.write_file("/tmp/fetch.py", FETCH)
        await sb.write_file("/workspace/acked.txt", f"acked {sb.id}")
        written[sb.id] = f"acked {sb.id}"
    want_big = f"{BIG} {hashlib.sha256(_payload(BIG)).hexdigest()}"
    assert await _fetch(boxes[1], small) == (0, f"1000 {hashlib.sha256(_payload(1000)).hexdigest()}", "")
    first = _squid_pids(state_root)
    assert len(first) == 1, first

    result: list[tuple[int, str, str]] = []

    async def download() -> None:
        result.append(await _fetch(boxes[0], big))

    async with anyio.create_task_group() as tg:
        tg.start_soon(download)
        with anyio.fail_after(120):
            while host_service.sent < BIG // 8:
                await anyio.sleep(0.05)
        os.kill(first[0], signal.SIGKILL)
    code, out, err = result[0]
    misreported = []
    if code == 0:  # only a complete, correct file may be reported as a success
        if out != want_big:
            misreported.append(f"interrupted download reported complete: {out}")
    assert code != 0 or out == want_big, (code, out, err)

    # The next connection brings squid back; every sandbox gets the whole file.
    refused = []  # what a connection racing the restart got (502 from the forwarder), if any
    for sb in boxes:
        for _ in range(3):
            got = await _fetch(sb, big)
            if got[0] == 0:
                break
            refused.append(got[2][-80:])
        if got[:2] != (0, want_big):
            misreported.append(f"{sb.id[:12]}: after the restart {got}")
    now = _squid_pids(state_root)
    assert len(now) == 1 and now != first, (first, now)
    # The allow-list holds after the restart, and is still logged.
    r = await boxes[2].exec(["python3", "/tmp/fetch.py", "http://pypi.org/simple/"], timeout=120)
    assert r.exit_code != 0 and "403" in r.stderr, (r.stdout, r.stderr[-500:])
    log = await egress_log_of(boxes[2], 1, "pypi.org")
    assert any(e.host == "pypi.org" and not e.allowed for e in log), log
    lost = 0
    for sb in boxes:  # acknowledged writes
        if await sb.read_file("/workspace/acked.txt") != written[sb.id].encode():
            misreported.append(f"{sb.id[:12]}: acknowledged write changed")
    print(f"\n[fault] squid killed mid-download: injected 1, sandboxes lost {lost}, writes lost 0, "
          f"misreported {len(misreported)}; the interrupted download: exit {code}, {err[-120:]!r}; "
          f"refused while squid restarted: {refused}")
    assert not misreported, misreported
    for sb in boxes:
        await sb.close()
    await provider.aclose()
    assert _squid_pids(state_root) == [], "squid outlived its provider"
    check = DockerProvider()
    try:
        assert await check.list({"sandgym.run": RUN}) == []
    finally:
        await check.aclose()
