"""Platform overhead: the prime-sandboxes SDK against `sandgym serve`, next to the same
operations through SandboxManager directly, measured in the same run.

    python benchmarks/platform_exec.py [--backend docker|local] [--creates 5] [--execs 100]

`sandgym serve` runs as its own process on 127.0.0.1 (a free port), backed by the same
provider the direct manager uses. Measured:
- create-to-ready: SDK `create` + `wait_for_creation` (which includes its `echo` probe) vs
  `manager.acquire` + one exec; also the server's own PENDING->RUNNING time, to separate the
  SDK's poll schedule (first poll after ~1 s, then x1.5) from server work;
- exec round trip of `true`: SDK `execute_command` vs `Sandbox.exec(["/bin/bash","-c","true"])`
  (the argv the SDK sends), sequential; and 50 concurrent execs, wall time;
- the `prime` provider (`PrimeProvider.create` / `PrimeSandbox.exec`) over the same server.
Ratios are platform time / direct time (1.0 = no overhead). Prints a table last.

    python benchmarks/platform_exec.py --before REF [--rounds 10] [--execs 50]

compares the platform itself across code versions instead: `REF`'s tree (e.g. the merge base
with main) is exported with `git archive` into a temp dir and served next to this tree's
server (with its SQLite state in a temp dir), both on the same engine; SDK `execute_command`
round trips of `true` are measured in interleaved rounds (before, after, after, before, ...)
so load drifts hit both alike. Prints p50/p90 per version and the ratio after/before.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import anyio
import httpx

from sandgym.sandboxes import SandboxManager, SandboxSpec

SPEC = SandboxSpec(memory_mb=512, disk_mb=256)
ARGV = ["/bin/bash", "-c", "true"]


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))] if xs else float("nan")


async def timed(n: int, fn: Callable[[], Awaitable[object]]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def concurrent(n: int, fn: Callable[[int], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(fn, i)
    return time.perf_counter() - t0


def start_server(
    backend: str, token: str, *, tree: str | None = None, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """`sandgym serve` from this checkout, or from the source tree `tree` (PYTHONPATH)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandgym", "serve", "--port", str(port), "--token", token,
         "--provider", backend, "--max-sandboxes", "8", "--log-level", "warning", *extra],
        env=env, cwd=tree,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sandgym serve did not start")


async def direct(backend: str, creates: int, execs: int) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {"create": [], "exec": [], "conc50": []}
    async with SandboxManager(backend, max_sandboxes=4) as mgr:
        for _ in range(creates):
            t0 = time.perf_counter()
            sb = await mgr.acquire(SPEC)
            await sb.exec(ARGV)
            res["create"].append(time.perf_counter() - t0)
            await mgr.release(sb)
        sb = await mgr.acquire(SPEC)
        try:
            await sb.exec(ARGV)  # warm up
            res["exec"] = await timed(execs, lambda: sb.exec(ARGV))
            res["conc50"] = [await concurrent(50, lambda i: sb.exec(["/bin/bash", "-c", f"echo {i}"]))]
        finally:
            await mgr.release(sb)
    return res


async def through_sdk(url: str, token: str, creates: int, execs: int) -> dict[str, list[float]]:
    from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest

    res: dict[str, list[float]] = {"create": [], "server_create": [], "exec": [], "conc50": []}
    c = AsyncSandboxClient(api_key=token)
    c.client.base_url = url
    req = dict(docker_image=SPEC.image, cpu_cores=SPEC.cpu, memory_gb=SPEC.memory_mb / 1024, disk_size_gb=SPEC.disk_mb / 1024)
    try:
        for i in range(creates):
            t0 = time.perf_counter()
            sb = await c.create(CreateSandboxRequest(name=f"bench-{i}", **req))  # type: ignore[arg-type]
            await c.wait_for_creation(sb.id)
            res["create"].append(time.perf_counter() - t0)
            got = await c.get(sb.id)
            if got.started_at is not None:
                res["server_create"].append((got.started_at - got.created_at).total_seconds())
            await c.delete(sb.id)
        sb = await c.create(CreateSandboxRequest(name="bench-exec", **req))  # type: ignore[arg-type]
        try:
            await c.wait_for_creation(sb.id)
            await c.execute_command(sb.id, "true")
            res["exec"] = await timed(execs, lambda: c.execute_command(sb.id, "true"))
            res["conc50"] = [await concurrent(50, lambda i: c.execute_command(sb.id, f"echo {i}"))]
        finally:
            await c.delete(sb.id)
    finally:
        await c.aclose()
    return res


async def through_provider(url: str, token: str, creates: int, execs: int, state: str) -> dict[str, list[float]]:
    from sandgym.sandboxes.ownership import new_run_id, owner_labels
    from sandgym.sandboxes.providers.prime import PrimeProvider

    res: dict[str, list[float]] = {"create": [], "exec": []}
    p = PrimeProvider(endpoints=[url], api_key=token, state_dir=state)
    labels = owner_labels(new_run_id())
    try:
        for _ in range(creates):
            t0 = time.perf_counter()
            sb = await p.create(SPEC, labels)
            res["create"].append(time.perf_counter() - t0)
            await sb.close()
        sb = await p.create(SPEC, labels)
        try:
            await sb.exec(ARGV)
            res["exec"] = await timed(execs, lambda: sb.exec(ARGV))
        finally:
            await sb.close()
    finally:
        await p.aclose()
    return res


def export_tree(ref: str, dest: str) -> str:
    """`ref`'s tracked files (git archive) in `dest`; returns its commit."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", ref], check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return commit


async def sdk_rounds(urls: dict[str, str], token: str, rounds: int, execs: int) -> dict[str, list[float]]:
    """One sandbox per server; `rounds` rounds of `execs` execs each, the order of the
    servers alternating (ABBA...)."""
    from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest

    req = dict(docker_image=SPEC.image, cpu_cores=SPEC.cpu, memory_gb=SPEC.memory_mb / 1024, disk_size_gb=SPEC.disk_mb / 1024)
    clients, ids, res = {}, {}, {k: [] for k in urls}  # type: ignore[var-annotated]
    try:
        for k, url in urls.items():
            c = AsyncSandboxClient(api_key=token)
            c.client.base_url = url
            clients[k] = c
            sb = await c.create(CreateSandboxRequest(name=f"bench-{k}", **req))  # type: ignore[arg-type]
            await c.wait_for_creation(sb.id)
            ids[k] = sb.id
            for _ in range(5):
                await c.execute_command(sb.id, "true")  # warm up
        order = list(urls)
        for r in range(rounds):
            for k in order if r % 2 == 0 else order[::-1]:
                c, sid = clients[k], ids[k]
                res[k] += await timed(execs, lambda c=c, sid=sid: c.execute_command(sid, "true"))
    finally:
        for k, c in clients.items():
            if k in ids:
                await c.delete(ids[k])
            await c.aclose()
    return res


def before_after(backend: str, ref: str, rounds: int, execs: int) -> None:
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="bench-before-") as tree, tempfile.TemporaryDirectory(prefix="bench-state-") as state:
        commit = export_tree(ref, tree)
        here = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
        before, url_b = start_server(backend, token, tree=tree)
        after, url_a = start_server(backend, token, extra=("--state-dir", state))
        try:
            res = anyio.run(sdk_rounds, {"before": url_b, "after": url_a}, token, rounds, execs)
        finally:
            for proc in (before, after):
                proc.terminate()
                proc.wait(120)
    print(f"backend={backend} rounds={rounds} execs/round={execs} before={ref} ({commit}) after={here} (this tree)")
    print()
    print(f"{'SDK execute_command `true`':32} {'p50':>8} {'p90':>8} {'n':>5}")
    for k in ("before", "after"):
        print(f"{k:32} {med(res[k]) * 1000:6.2f}ms {p90(res[k]) * 1000:6.2f}ms {len(res[k]):5d}")
    print(f"{'ratio after/before (p50)':32} {med(res['after']) / med(res['before']):8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="docker", choices=["docker", "local"])
    ap.add_argument("--creates", type=int, default=5)
    ap.add_argument("--execs", type=int, default=100)
    ap.add_argument("--before", metavar="REF", help="compare this tree's server with REF's (git ref)")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds for --before")
    args = ap.parse_args()
    if args.before:
        os.environ["HOME"] = tempfile.mkdtemp(prefix="bench-home-")
        before_after(args.backend, args.before, args.rounds, args.execs)
        return

    token = secrets.token_hex(16)
    home = tempfile.mkdtemp(prefix="bench-home-")
    os.environ["HOME"] = home  # the SDK's ~/.prime auth cache stays out of the real home
    proc, url = start_server(args.backend, token)
    try:
        d = anyio.run(direct, args.backend, args.creates, args.execs)
        s = anyio.run(through_sdk, url, token, args.creates, args.execs)
        p = anyio.run(through_provider, url, token, args.creates, args.execs, home)
    finally:
        proc.terminate()
        proc.wait(120)

    print(f"backend={args.backend} creates={args.creates} execs={args.execs} server={url}")
    rows = [
        ("create-to-ready, SDK (create+wait_for_creation)", s["create"], d["create"]),
        ("  of which server PENDING->RUNNING", s["server_create"], d["create"]),
        ("create-to-ready, prime provider", p["create"], d["create"]),
        ("exec `true` round trip, SDK execute_command", s["exec"], d["exec"]),
        ("exec `true` round trip, prime provider", p["exec"], d["exec"]),
        ("50 concurrent execs (wall), SDK", s["conc50"], d["conc50"]),
    ]
    print()
    print(f"{'operation':50} {'platform med':>12} {'p90':>8} {'direct med':>11} {'ratio':>7}")
    for name, plat, base in rows:
        print(f"{name:50} {med(plat) * 1000:10.1f}ms {p90(plat) * 1000:6.1f}ms {med(base) * 1000:9.1f}ms {med(plat) / med(base):7.2f}")


if __name__ == "__main__":
    main()
