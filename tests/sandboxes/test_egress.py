"""Allow-listed egress on the real engine and a real squid: decided outside the sandbox,
logged per sandbox, changeable at runtime, for strict (runc) and vm (gVisor) alike."""

from __future__ import annotations

import http.server
import io
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.errors import SandboxCreateError, SandboxError
from sandgym.sandboxes.ownership import owner_labels
from sandgym.sandboxes.providers.docker import DockerProvider, DockerSandbox
from sandgym.sandboxes.result import EgressLogEntry
from sandgym.sandboxes.spec import EgressPolicy, SandboxSpec
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.requires("docker", "egress")]

RUN = uuid.uuid4().hex[:12]
LABELS = {**owner_labels("test-egress"), "sandgym.run": RUN}
ALIAS = "host.sandgym.internal"
BASE = SandboxSpec(memory_mb=512, disk_mb=256, ttl_s=900, exec_timeout_s=120)

FETCH = """\
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            print(url, "OK", r.status, r.read().decode(errors="replace")[:40].strip())
    except urllib.error.HTTPError as e:
        print(url, "HTTP", e.code, e.read().decode(errors="replace").strip()[:200])
    except Exception as e:
        print(url, "ERR", repr(e)[:200])
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture(scope="module")
def host_service() -> Iterator[int]:
    """A loopback HTTP service on the host (like verifiers' interception server)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def provider(host_service: int) -> AsyncIterator[DockerProvider]:
    p = DockerProvider(egress_host_ports=[host_service])
    try:
        yield p
    finally:
        for info in await p.list({"sandgym.run": RUN}):
            await p.remove(info.id)
        proxy_dir = p._proxy.dir if p._proxy else None
        await p.aclose()
        assert proxy_dir is None or not proxy_dir.exists()  # its state goes with it


@pytest.fixture
async def made(provider: DockerProvider) -> AsyncIterator[list[DockerSandbox]]:
    boxes: list[DockerSandbox] = []
    try:
        yield boxes
    finally:
        for b in boxes:
            await b.close()


def _spec(provider: DockerProvider, profile: str, policy: EgressPolicy | None) -> SandboxSpec:
    if profile == "vm":
        require("vm")
    spec = BASE.model_copy(update={"profile": profile, "egress": policy, "network": policy is not None})
    provider.check(spec)  # a SpecError here is a failure: the capabilities above are there
    return spec


async def egress_log_of(sb: Sandbox, lines: int, host: str | None = None) -> list[EgressLogEntry]:
    """The egress log once it has `lines` lines (of `host`), or as it is after 10 s: the
    proxy writes a request's line when it has finished with it, which can be a moment after
    the client has its answer (seen under a loaded CI run)."""
    for _ in range(100):
        log = await sb.egress_log()
        if sum(host is None or e.host == host for e in log) >= lines:
            break
        await anyio.sleep(0.1)
    return log


async def _new(provider: DockerProvider, made: list[DockerSandbox], spec: SandboxSpec) -> DockerSandbox:
    sb = await provider.create(spec, LABELS)
    made.append(sb)
    await sb.write_file("/tmp/fetch.py", FETCH)
    return sb


@pytest.mark.parametrize("profile", ["strict", "vm"])
async def test_allowed_denied_and_logged(
    provider: DockerProvider, made: list[DockerSandbox], host_service: int, profile: str
) -> None:
    sb = await _new(provider, made, _spec(provider, profile, EgressPolicy(allow=[ALIAS])))
    r = await sb.exec(["python3", "/tmp/fetch.py",
                       f"http://{ALIAS}:{host_service}/",          # allowed: named, exposed port
                       "http://not-on-the-list.example.org/",      # not on the list
                       f"http://127.0.0.1:{host_service}/"])       # the sandbox's own loopback
    lines = r.stdout.splitlines()
    assert lines[0].endswith("OK 200 hello from the host"), r.stdout
    assert "HTTP 403 sandgym egress: not-on-the-list.example.org:80 is not on the allow-list of this sandbox" in lines[1]
    assert "ERR" in lines[2] and "Connection refused" in lines[2]  # NO_PROXY: its own loopback, empty
    # Host-internal addresses, asked of the proxy directly, are refused by the proxy itself.
    r = await sb.exec(["python3", "-c", (
        "import urllib.request, urllib.error\n"
        "o = urllib.request.build_opener(urllib.request.ProxyHandler({'http': 'http://127.0.0.1:3128'}))\n"
        f"try: o.open('http://127.0.0.1:{host_service}/', timeout=20)\n"
        "except urllib.error.HTTPError as e: print(e.code, e.read().decode().strip())")],
        env={"NO_PROXY": "", "no_proxy": ""})
    assert r.stdout.startswith("403 sandgym egress: 127.0.0.1 is a host-internal address"), r.stdout
    log = await egress_log_of(sb, 3)
    assert all(e.sandbox == sb.id for e in log)
    seen = {(e.host, e.port, e.allowed) for e in log}
    assert (ALIAS, host_service, True) in seen
    assert ("not-on-the-list.example.org", 80, False) in seen
    assert ("127.0.0.1", host_service, False) in seen
    denied = next(e for e in log if e.host == "not-on-the-list.example.org")
    assert denied.status == 403 and "allow-list" in denied.reason


async def test_https_tunnels_use_connect_and_the_host_ca(provider: DockerProvider, made: list[DockerSandbox]) -> None:
    sb = await _new(provider, made, _spec(provider, "strict", EgressPolicy(allow=["pypi.org"])))
    r = await sb.exec("env | grep -E '^(HTTPS_PROXY|NO_PROXY|SSL_CERT_FILE)=' | sort; python3 /tmp/fetch.py https://deb.debian.org/")
    assert "HTTPS_PROXY=http://127.0.0.1:3128" in r.stdout and "NO_PROXY=localhost,127.0.0.1,::1" in r.stdout
    if provider.ca_bundle:
        assert "SSL_CERT_FILE=/run/sandgym-ca.crt" in r.stdout
        assert (await sb.exec("test -r /run/sandgym-ca.crt && ! test -w /run/sandgym-ca.crt && echo ro")).stdout == "ro\n"
    assert "Tunnel connection failed: 403" in r.stdout, r.stdout
    (e,) = [e for e in await egress_log_of(sb, 1, "deb.debian.org") if e.host == "deb.debian.org"]
    assert e.method == "CONNECT" and e.port == 443 and not e.allowed


@pytest.mark.parametrize("profile", ["strict", "vm"])
async def test_set_egress_at_runtime(
    provider: DockerProvider, made: list[DockerSandbox], host_service: int, profile: str
) -> None:
    url = f"http://{ALIAS}:{host_service}/"
    sb = await _new(provider, made, _spec(provider, profile, EgressPolicy.nothing()))
    assert " HTTP 403 " in (await sb.exec(["python3", "/tmp/fetch.py", url])).stdout
    await sb.set_egress(EgressPolicy(allow=[f"{ALIAS}:{host_service}"]))
    assert " OK 200 " in (await sb.exec(["python3", "/tmp/fetch.py", url])).stdout
    await sb.set_egress(EgressPolicy(allow=["*"], deny=[ALIAS]))
    assert " HTTP 403 " in (await sb.exec(["python3", "/tmp/fetch.py", url])).stdout
    await sb.set_egress(None)
    assert " HTTP 403 " in (await sb.exec(["python3", "/tmp/fetch.py", url])).stdout
    assert [e.allowed for e in await egress_log_of(sb, 4, ALIAS) if e.host == ALIAS] == [False, True, False, False]


async def test_no_egress_means_no_way_out(provider: DockerProvider, made: list[DockerSandbox]) -> None:
    sb = await _new(provider, made, BASE)
    r = await sb.exec("env | grep -ci proxy; ls /run/sandgym")
    count, *files = r.stdout.split()
    assert count == "0"  # no proxy settings
    assert "execd.sock" in files and "egress.sock" not in files  # no relay socket (the owner's lifeline may sit there)
    with pytest.raises(SandboxError, match="created without egress"):
        await sb.set_egress(EgressPolicy.anything())
    assert await sb.egress_log() == []


async def test_egress_needs_python_in_the_image(provider: DockerProvider) -> None:
    tag = f"sandgym-test/nopython-egress:{RUN}"
    provider.client.images.build(
        fileobj=io.BytesIO(b"FROM sandgym/base:latest\nRUN rm -f /usr/bin/python3* /usr/local/bin/python3*\n"),
        tag=tag, rm=True, network_mode="none",
    )
    try:
        spec = BASE.model_copy(update={"image": tag, "egress": EgressPolicy(allow=["pypi.org"]), "network": True})
        with pytest.raises(SandboxCreateError, match=r"egress: image .* cannot run execd \(no python3"):
            await provider.create(spec, LABELS)
        assert await provider.list({"sandgym.run": RUN}) == []
    finally:
        provider.client.images.remove(tag, force=True)


@pytest.mark.parametrize("profile", ["strict", "vm"])
async def test_pip_install_through_the_allow_list(
    provider: DockerProvider, made: list[DockerSandbox], profile: str
) -> None:
    require("pypi")
    sb = await _new(provider, made, _spec(provider, profile, EgressPolicy(allow=["pypi.org", "*.pythonhosted.org"])))
    # Debian's python refuses pip outside a venv unless told (PEP 668); strict has no root.
    target = "--user --break-system-packages" if profile == "strict" else "--break-system-packages"
    r = await sb.exec(f"pip install -q --no-cache-dir --retries 0 {target} six==1.16.0 && python3 -c 'import six; print(six.__version__)'",
                      timeout=180)
    assert r.exit_code == 0 and r.stdout.strip().endswith("1.16.0"), (r.stdout, r.stderr[-2000:])
    # A host not on the list fails at once, saying so.
    r = await sb.exec(["python3", "/tmp/fetch.py", "https://deb.debian.org/debian/"])
    assert "Tunnel connection failed: 403 Forbidden" in r.stdout, r.stdout
    log = await egress_log_of(sb, 1, "deb.debian.org")
    allowed = {e.host for e in log if e.allowed}
    assert {"pypi.org", "files.pythonhosted.org"} <= allowed, log
    assert any(e.host == "deb.debian.org" and not e.allowed and "allow-list" in e.reason for e in log)
