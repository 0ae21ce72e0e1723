"""Load: many concurrent sandboxes, many execs each, through the manager (docker) and through
the platform API (the prime provider against `sandgym serve` on 127.0.0.1, docker behind it).

Sizes: 8 sandboxes x 50 execs by default (CI); SANDGYM_LOAD_FULL=1 runs the full 64 x 1,000;
SANDGYM_LOAD_SANDBOXES / SANDGYM_LOAD_EXECS pick any other size. Loopback only.

Each run first warms up (a short round at full width, so imports, caches and connection
pools exist at the size the load needs),
then measures the process's open file descriptors and resident memory, runs the load, tears
everything down and measures again. Bounds (stated here, asserted below):
  - containers: none of this run's left (the engine is asked by owner label);
  - file descriptors: at most FD_SLACK more than before (pooled connections may stay);
  - RSS growth: at most RSS_SLACK_MB + RSS_PER_EXEC_KB per exec run (allocator noise, not
    a leak: a leak of one result per exec at 64 x 1,000 would be hundreds of MiB).
Latency p50/p99 (per exec, as the caller sees it) is printed: `pytest -s tests/load`.
"""

from __future__ import annotations

import gc
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from sandgym.sandboxes import SandboxSpec
from sandgym.sandboxes.manager import SandboxManager
from tests.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

FULL = os.environ.get("SANDGYM_LOAD_FULL") == "1"
N_SANDBOXES = int(os.environ.get("SANDGYM_LOAD_SANDBOXES") or (64 if FULL else 8))
N_EXECS = int(os.environ.get("SANDGYM_LOAD_EXECS") or (1000 if FULL else 50))
FD_SLACK = 16
RSS_SLACK_MB = 64
RSS_PER_EXEC_KB = 1  # 64 x 1,000 execs -> 62.5 MiB more allowed

SPEC = SandboxSpec(cpu=0.25, memory_mb=128, disk_mb=16, pids=64, exec_timeout_s=60, ttl_s=1800)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


@dataclass
class LoadReport:
    name: str
    latencies: list[float]
    wall_s: float
    fds_before: int
    fds_after: int
    rss_before: float
    rss_after: float

    def print(self) -> None:
        lat = self.latencies
        print(
            f"\n[load] {self.name}: {N_SANDBOXES} sandboxes x {N_EXECS} execs = {len(lat)} execs in {self.wall_s:.1f}s "
            f"({len(lat) / self.wall_s:.0f}/s); latency p50 {percentile(lat, 50) * 1e3:.1f} ms, "
            f"p99 {percentile(lat, 99) * 1e3:.1f} ms, mean {statistics.fmean(lat) * 1e3:.1f} ms; "
            f"fds {self.fds_before} -> {self.fds_after}; RSS {self.rss_before:.0f} -> {self.rss_after:.0f} MiB"
        )

    def check(self) -> None:
        assert len(self.latencies) == N_SANDBOXES * N_EXECS
        assert self.fds_after <= self.fds_before + FD_SLACK, f"fd leak: {self.fds_before} -> {self.fds_after}"
        bound = RSS_SLACK_MB + RSS_PER_EXEC_KB * len(self.latencies) / 1024
        assert self.rss_after - self.rss_before <= bound, (
            f"RSS grew {self.rss_after - self.rss_before:.0f} MiB (bound {bound:.0f} MiB)"
        )


async def drive(sandboxes: list, n_execs: int, latencies: list[float]) -> None:
    """Every sandbox runs `n_execs` commands back to back; all sandboxes at once. Each
    command's output is checked, so a dropped or crossed reply fails the run."""

    async def one(i: int, sb) -> None:
        for k in range(n_execs):
            t = time.perf_counter()
            res = await sb.exec(["echo", f"{i}:{k}"], timeout=60)
            latencies.append(time.perf_counter() - t)
            assert res.exit_code == 0 and res.stdout == f"{i}:{k}\n", (i, k, res)

    async with anyio.create_task_group() as tg:
        for i, sb in enumerate(sandboxes):
            tg.start_soon(one, i, sb)


async def measured(name: str, run: Callable[[int, int, list[float]], Awaitable[None]]) -> LoadReport:
    # Warm-up at full width: imports, caches, and every connection pool (the engine API's,
    # the SDK's, the server's) grown to what this many sandboxes use. Pools plateau; a
    # leak grows with every run, so growth past this point is what the bounds catch.
    await run(N_SANDBOXES, 2, [])
    gc.collect()
    fds0, rss0 = open_fds(), rss_mb()
    latencies: list[float] = []
    t0 = time.perf_counter()
    await run(N_SANDBOXES, N_EXECS, latencies)
    wall = time.perf_counter() - t0
    gc.collect()
    await anyio.sleep(0.5)  # let closed connections' fds be released by the loop
    rep = LoadReport(name, latencies, wall, fds0, open_fds(), rss0, rss_mb())
    rep.print()
    return rep


def engine_ids(label: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": label})]
    finally:
        client.close()


async def no_containers(label: str, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := await anyio.to_thread.run_sync(engine_ids, label)) and time.monotonic() < deadline:
        await anyio.sleep(0.5)
    return left


async def test_manager_load_docker() -> None:
    require("docker")
    run_ids: list[str] = []

    async def run(n: int, m: int, latencies: list[float]) -> None:
        async with SandboxManager("docker", max_sandboxes=n, run_id="load-" + secrets.token_hex(5)) as mgr:
            run_ids.append(mgr.run_id)
            sbs = []
            try:
                async with anyio.create_task_group() as tg:

                    async def make() -> None:
                        sbs.append(await mgr.acquire(SPEC))

                    for _ in range(n):
                        tg.start_soon(make)
                assert mgr.live == n
                await drive(sbs, m, latencies)
            finally:
                for sb in sbs:
                    await mgr.release(sb)
            assert mgr.live == 0

    rep = await measured("manager/docker", run)
    for rid in run_ids:
        assert await no_containers(f"sandgym.owner={rid}") == [], f"containers of run {rid} left behind"
    rep.check()


async def test_platform_api_load(tmp_path: Path) -> None:
    require("docker")
    from sandgym.platform.testing import serve_in_thread
    from sandgym.sandboxes.providers.prime import PrimeProvider

    token = "load-" + secrets.token_hex(8)
    state = str(tmp_path / "prime-state")
    owner = "load-" + secrets.token_hex(5)
    with serve_in_thread([token], "docker", max_sandboxes=N_SANDBOXES + 2, quota=N_SANDBOXES + 2) as srv:
        platform_owner = srv.service.manager.run_id

        async def run(n: int, m: int, latencies: list[float]) -> None:
            provider = PrimeProvider(endpoints=[srv.url], api_key=token, state_dir=state)
            sbs = []
            try:
                async with anyio.create_task_group() as tg:

                    async def make() -> None:
                        sbs.append(await provider.create(SPEC, {"sandgym.owner": owner}))

                    for _ in range(n):
                        tg.start_soon(make)
                await drive(sbs, m, latencies)
            finally:
                with anyio.CancelScope(shield=True):
                    for sb in sbs:
                        await sb.close()
                    left = await provider.list({"sandgym.owner": owner})
                    await provider.aclose()
            assert [i for i in left if i.status not in ("TERMINATED", "ERROR")] == [], left

        rep = await measured("platform API (prime SDK -> sandgym serve -> docker)", run)
        assert await no_containers(f"sandgym.owner={platform_owner}") == [], "the platform left containers behind"
    rep.check()
