"""Sandbox latency: sandgym's manager vs raw Docker SDK calls, measured in the same run.

    python benchmarks/sandbox_latency.py [--creates 10] [--execs 100]

Measures create-to-ready (container started and able to run a command), exec round trip
for `true` and `python3 -c pass`, and warm-pool acquire. The baseline is the Docker SDK used
directly: `containers.run(...)` + `exec_run`, with the same image and network none.
Prints a table last; ratio = sandgym time / baseline time (lower is better).
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import docker

from sandgym.sandboxes import SandboxManager, SandboxSpec


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def raw_docker(image: str, creates: int, execs: int) -> dict[str, list[float]]:
    client = docker.from_env()
    out: dict[str, list[float]] = {"create": [], "true": [], "python": []}
    for _ in range(creates):
        t0 = time.perf_counter()
        c = client.containers.run(image, ["sleep", "600"], detach=True, network_mode="none",
                                  labels={"sandgym.bench": "raw"})
        c.exec_run(["true"])
        out["create"].append(time.perf_counter() - t0)
        c.remove(force=True)
    c = client.containers.run(image, ["sleep", "600"], detach=True, network_mode="none",
                              labels={"sandgym.bench": "raw"})
    try:
        for _ in range(execs):
            t0 = time.perf_counter()
            c.exec_run(["true"])
            out["true"].append(time.perf_counter() - t0)
        for _ in range(max(10, execs // 5)):
            t0 = time.perf_counter()
            c.exec_run(["python3", "-c", "pass"])
            out["python"].append(time.perf_counter() - t0)
    finally:
        c.remove(force=True)
    return out


async def ours(spec: SandboxSpec, creates: int, execs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"create": [], "true": [], "python": [], "warm": []}
    async with SandboxManager("docker", max_sandboxes=4) as mgr:
        for _ in range(creates):
            t0 = time.perf_counter()
            sb = await mgr.acquire(spec)
            await sb.exec(["true"])
            out["create"].append(time.perf_counter() - t0)
            await mgr.release(sb)
        async with mgr.sandbox(spec) as sb:
            for _ in range(execs):
                t0 = time.perf_counter()
                await sb.exec(["true"])
                out["true"].append(time.perf_counter() - t0)
            for _ in range(max(10, execs // 5)):
                t0 = time.perf_counter()
                await sb.exec(["python3", "-c", "pass"])
                out["python"].append(time.perf_counter() - t0)
        warm_spec = spec.model_copy(update={"labels": {"pool": "warm"}})
        for _ in range(creates):
            await mgr.warm(warm_spec, 1)
            t0 = time.perf_counter()
            sb = await mgr.acquire(warm_spec)
            out["warm"].append(time.perf_counter() - t0)
            await mgr.release(sb)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--creates", type=int, default=10)
    ap.add_argument("--execs", type=int, default=100)
    args = ap.parse_args()
    spec = SandboxSpec()
    base = raw_docker(spec.image, args.creates, args.execs)
    mine = anyio.run(ours, spec, args.creates, args.execs)

    rows = [
        ("create-to-ready", "create", "create"),
        ("exec `true`", "true", "true"),
        ("exec `python3 -c pass`", "python", "python"),
        ("warm-pool acquire", "warm", "create"),
    ]
    print(f"\nsandbox latency, image {spec.image}, {args.creates} creates, {args.execs} execs (ms)")
    print(f"{'operation':26} {'sandgym p50':>12} {'p95':>9} {'raw SDK p50':>12} {'p95':>9} {'ratio p50':>10}")
    for label, k_ours, k_raw in rows:
        a, b = mine[k_ours], base[k_raw]
        ratio = statistics.median(a) / statistics.median(b)
        print(f"{label:26} {1e3 * pct(a, .5):12.1f} {1e3 * pct(a, .95):9.1f} "
              f"{1e3 * pct(b, .5):12.1f} {1e3 * pct(b, .95):9.1f} {ratio:10.2f}")
    print("(warm-pool acquire is compared with a raw create-to-ready)")


if __name__ == "__main__":
    main()
