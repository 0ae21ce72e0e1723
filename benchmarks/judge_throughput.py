"""Judge throughput: tests judged per second, sandgym's judge vs a naive one-process-per-test
harness, in the same run and the same sandbox.

    python benchmarks/judge_throughput.py [--tests 100] [--rounds 3] [--provider docker]

Workload: three stdin problems of the self-written set (a_plus_b, sort_numbers, average) with
`--tests` tests each, judged with their reference solutions (every test passes, so every
test runs). Both sides use one sandbox (cpu 1, 1 GiB) of the default image:

- judge: `sandgym.judge.judge(sandbox, code, problem)`: one exec per problem; inside it a fork
  server runs each test in a fresh child with time/memory/output limits and compares.
- naive: one `sandbox.exec(["python3", "-c", code], stdin=test input)` per test (a fresh
  interpreter and an exec round trip per test), stdout compared on the host the same way.

The order alternates per round (a shared host's load falls on both alike); the median of
rounds is reported, with the load average around each measurement. A table comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import anyio


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def workload(n_tests: int) -> list:
    from sandgym.judge.model import TestCase
    from sandgym.judge.problemset import problem

    rng = random.Random(7)
    out = []
    a = problem("a_plus_b")
    tests = []
    for _ in range(n_tests):
        x, y = rng.randint(-10**9, 10**9), rng.randint(-10**9, 10**9)
        tests.append(TestCase(input=f"{x} {y}\n", output=f"{x + y}\n"))
    out.append(a.model_copy(update={"tests": tests}))
    s = problem("sort_numbers")
    tests = []
    for _ in range(n_tests):
        xs = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 50))]
        tests.append(TestCase(input=f"{len(xs)}\n{' '.join(map(str, xs))}\n", output=" ".join(map(str, sorted(xs))) + "\n"))
    out.append(s.model_copy(update={"tests": tests}))
    m = problem("average")
    tests = []
    for _ in range(n_tests):
        xs = [rng.randint(-100, 100) for _ in range(rng.randint(1, 20))]
        tests.append(TestCase(input=f"{len(xs)}\n{' '.join(map(str, xs))}\n", output=f"{sum(xs) / len(xs):.9f}\n"))
    out.append(m.model_copy(update={"tests": tests}))
    return out


async def run_judge(sb, problems) -> tuple[int, int, float]:
    from sandgym.judge.judge import judge

    t0 = time.perf_counter()
    n = ok = 0
    for p in problems:
        r = await judge(sb, p.solutions[0], p)
        n += r.total
        ok += r.passed
    return n, ok, time.perf_counter() - t0


async def run_naive(sb, problems) -> tuple[int, int, float]:
    from sandgym.judge.sandbox_harness import compare_text

    t0 = time.perf_counter()
    n = ok = 0
    for p in problems:
        code = p.solutions[0]
        for t in p.tests:
            r = await sb.exec(["python3", "-c", code], stdin=t.input, timeout=p.time_limit_s * 2 + 0.5)
            n += 1
            ok += int(r.exit_code == 0 and not r.timed_out and compare_text(r.stdout, t.output, p.compare, p.float_tol))
    return n, ok, time.perf_counter() - t0


async def main_async(args: argparse.Namespace) -> dict:
    from sandgym.sandboxes import SandboxManager, SandboxSpec

    problems = workload(args.tests)
    runs: dict[str, list[dict]] = {"judge": [], "naive": []}
    spec = SandboxSpec(cpu=1.0, memory_mb=1024, disk_mb=64, exec_timeout_s=600)
    async with SandboxManager(args.provider, max_sandboxes=1) as mgr, mgr.sandbox(spec) as sb:
        await run_judge(sb, problems[:1])  # warm: page cache, interpreter files
        for rnd in range(args.rounds):
            order = ["judge", "naive"] if rnd % 2 == 0 else ["naive", "judge"]
            for side in order:
                before = load()
                n, ok, dt = await (run_judge if side == "judge" else run_naive)(sb, problems)
                runs[side].append({"tests": n, "passed": ok, "s": dt, "per_s": n / dt, "load_before": before, "load_after": load()})
                print(f"round {rnd} {side:6} {n} tests ({ok} passed) in {dt:.2f} s = {n / dt:.1f} tests/s  load {before} -> {load()}",
                      flush=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=100, help="tests per problem (3 problems)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--provider", default="docker")
    args = ap.parse_args()
    runs = anyio.run(main_async, args)
    j = statistics.median(r["per_s"] for r in runs["judge"])
    n = statistics.median(r["per_s"] for r in runs["naive"])
    bad = [r for side in runs.values() for r in side if r["passed"] != r["tests"]]
    print(json.dumps({"runs": runs}))
    print(f"\ncpus={os.cpu_count()} provider={args.provider} tests/round={runs['judge'][0]['tests']} rounds={args.rounds} "
          f"(median tests/s over rounds){'  WARNING: some tests failed' if bad else ''}")
    print(f"{'harness':<48}{'tests/s':>10}{'vs naive':>10}")
    print(f"{'sandgym judge (one exec per problem, fork/test)':<48}{j:>10.1f}{j / n:>10.2f}")
    print(f"{'naive (one exec + interpreter per test)':<48}{n:>10.1f}{1.0:>10.2f}")


if __name__ == "__main__":
    main()
