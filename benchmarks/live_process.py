"""Live processes vs exec through `sandgym serve`: the prime-sandboxes SDK's `open_process`
(Connect Start with stdin: a live process) against `execute_command` (a plain exec) on the
same `vm` sandbox (gVisor), idle and with 6 busy sandboxes beside it, in one run.

    python benchmarks/live_process.py [--rounds 6] [--n 10] [--busy 6] [--before REF]

Each measured operation runs `cat /etc/os-release` and reads its output: `execute_command`
returns it; `open_process` streams it, then `wait()` gives the exit code (what verifiers'
`runtime.read` pays per file). Rounds alternate the order of the two operations. Busy
sandboxes each run a CPU-bound Python loop (`while True: pass`) started in the background.

`--before REF` also serves REF's tree (exported with `git archive`) on the same engine, so
the table has that version's numbers from the same run (e.g. the Docker exec API live
process this tree replaced). The ratio column is open_process p50 / execute_command p50 of
the same server in the same phase; load averages are printed per phase. Prints a table last.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import anyio
from platform_exec import (  # benchmarks/ is on sys.path when run as a script
    export_tree,
    start_server,
)

CMD = "cat /etc/os-release"
REQ = {"docker_image": "sandgym/python:latest", "cpu_cores": 1, "memory_gb": 0.25, "disk_size_gb": 0.25}


def p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


async def _exec(c: object, sid: str) -> None:
    res = await c.execute_command(sid, CMD)  # type: ignore[attr-defined]
    assert res.exit_code == 0 and "ID=" in res.stdout, res


async def _open(c: object, sid: str) -> None:
    proc = await c.open_process(sid, CMD)  # type: ignore[attr-defined]
    try:
        out = b""
        async for chunk in proc.stdout:
            out += chunk
        code = await proc.wait()
        assert code == 0 and b"ID=" in out, (code, out)
    finally:
        await proc.aclose()


async def timed(n: int, fn: Callable[[], Awaitable[None]]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def run(urls: dict[str, str], token: str, rounds: int, n: int, busy: int) -> tuple[dict[tuple[str, str, str], list[float]], dict[str, str]]:
    from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest

    clients: dict[str, AsyncSandboxClient] = {}
    ids: dict[str, str] = {}
    hogs: list[str] = []
    res: dict[tuple[str, str, str], list[float]] = {}
    loads: dict[str, str] = {}

    async def phase(name: str) -> None:
        before = load()
        for r in range(rounds):
            for k in urls:
                c, sid = clients[k], ids[k]
                ops = [("execute_command", _exec), ("open_process", _open)]
                for op, fn in ops if r % 2 == 0 else ops[::-1]:
                    res.setdefault((name, k, op), []).extend(await timed(n, lambda fn=fn, c=c, sid=sid: fn(c, sid)))
        loads[name] = f"{before} -> {load()}"

    try:
        for k, url in urls.items():
            c = AsyncSandboxClient(api_key=token)
            c.client.base_url = url
            clients[k] = c
            sb = await c.create(CreateSandboxRequest(name=f"bench-live-{k}", **REQ))  # type: ignore[arg-type]
            await c.wait_for_creation(sb.id)
            ids[k] = sb.id
            for _ in range(3):  # warm up both paths
                await _exec(c, sb.id)
                await _open(c, sb.id)
        await phase("idle")
        c0 = next(iter(clients.values()))
        for i in range(busy):
            sb = await c0.create(CreateSandboxRequest(name=f"bench-hog-{i}", **REQ))  # type: ignore[arg-type]
            hogs.append(sb.id)
        for sid in hogs:
            await c0.wait_for_creation(sid)
            await c0.execute_command(sid, "nohup python3 -c 'while True: pass' >/dev/null 2>&1 &")
        await anyio.sleep(3)  # let the load build
        await phase(f"{busy} busy")
    finally:
        c0 = next(iter(clients.values()), None)
        for sid in hogs:
            assert c0 is not None
            await c0.delete(sid)
        for k, c in clients.items():
            if k in ids:
                await c.delete(ids[k])
            await c.aclose()
    return res, loads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--n", type=int, default=10, help="calls per operation per round")
    ap.add_argument("--busy", type=int, default=6)
    ap.add_argument("--before", metavar="REF", help="also serve REF's tree and measure it in the same run")
    args = ap.parse_args()
    os.environ["HOME"] = tempfile.mkdtemp(prefix="bench-home-")  # the SDK's auth cache
    token = secrets.token_hex(16)
    procs = []
    urls: dict[str, str] = {}
    labels: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-before-") as tree, tempfile.TemporaryDirectory(prefix="bench-state-") as state:
        try:
            proc, urls["this tree"] = start_server("docker", token, extra=("--profile", "vm", "--state-dir", state))
            procs.append(proc)
            here = os.popen("git describe --always --dirty").read().strip()
            labels["this tree"] = here
            if args.before:
                commit = export_tree(args.before, tree)
                proc, urls["before"] = start_server("docker", token, tree=tree, extra=("--profile", "vm"))
                procs.append(proc)
                labels["before"] = f"{args.before} ({commit})"
            res, loads = anyio.run(run, urls, token, args.rounds, args.n, args.busy)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(120)

    print(f"profile=vm (gVisor) command={CMD!r} rounds={args.rounds} n/round={args.n} busy={args.busy} cpus={os.cpu_count()}")
    for k, v in labels.items():
        print(f"  {k}: {v}")
    for ph, ld in loads.items():
        print(f"  load average (1/5/15 min) during {ph}: {ld}")
    print()
    print("| phase | server | execute_command p50 ms | p90 | open_process p50 ms | p90 | open/exec (p50) | n |")
    print("|---|---|---|---|---|---|---|---|")
    for ph in loads:
        for k in urls:
            e, o = res[(ph, k, "execute_command")], res[(ph, k, "open_process")]
            print(f"| {ph} | {k} | {statistics.median(e) * 1000:.1f} | {p(e, 0.9) * 1000:.1f} | "
                  f"{statistics.median(o) * 1000:.1f} | {p(o, 0.9) * 1000:.1f} | "
                  f"{statistics.median(o) / statistics.median(e):.2f}x | {len(e)} |")


if __name__ == "__main__":
    main()
