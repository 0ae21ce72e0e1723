"""Per-task network (issue 16, on issue 12's egress allow-lists): a row with `network: true`
gets exactly the operator's allow-list, logged per instance; rows without it never get a way
out, and a `network: true` row with no allow-list is refused with the option to use."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from sandgym.sandboxes.manager import SandboxManager
from sandgym.sandboxes.providers.docker import DockerProvider
from sandgym.swe.debug import SWEDebugRunner
from sandgym.swe.tasks import SWETask
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]
ALIAS = "host.sandgym.internal"


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
def host_port() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


async def test_network_rows_get_exactly_the_allow_list(bundled: dict[str, SWETask], host_port: int) -> None:
    require("docker", "egress")
    plain = bundled["statskit__median-even"]
    net = plain.model_copy(update={"network": True})
    url = f"http://{ALIAS}:{host_port}/"
    fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}', timeout=20).read().decode())\""
    async with SandboxManager(DockerProvider(egress_host_ports=[host_port]), max_sandboxes=1) as mgr:

        async def run(task: SWETask, allow: list[str] | None):  # type: ignore[no-untyped-def]
            return await SWEDebugRunner(mgr, step="command", command=fetch, network_allow=allow).run_one(task)

        allowed = await run(net, [f"{ALIAS}:{host_port}"])
        assert allowed.step_exit_code == 0 and "hello from the host" in allowed.logs["step"], allowed.logs
        assert allowed.resolved is False and allowed.status == "unresolved"  # the command fixes nothing
        log = [json.loads(x) for x in allowed.logs["egress"].splitlines()]
        assert any(e["host"] == ALIAS and e["allowed"] for e in log), log

        denied = await run(net, ["pypi.org"])  # network, but not to that host
        assert denied.step_exit_code != 0 and "hello" not in denied.logs["step"]
        log = [json.loads(x) for x in denied.logs["egress"].splitlines()]
        assert any(e["host"] == ALIAS and not e["allowed"] for e in log), log

        # A row without `network: true` gets no egress, whatever the operator allows.
        closed = await run(plain, [f"{ALIAS}:{host_port}"])
        assert closed.step_exit_code != 0 and "hello" not in closed.logs["step"] and "egress" not in closed.logs

        refused = await run(net, None)
        assert refused.status == "error" and "--network-allow" in (refused.error or "")
        assert mgr.live == 0


def test_bad_allow_list_entries_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="allow"):
        SWEDebugRunner(None, network_allow=["http://not a host"])
