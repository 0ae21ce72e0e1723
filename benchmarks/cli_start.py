"""CLI start: `sandgym --help` against a bare `python3 -c pass`, in one run.

    python benchmarks/cli_start.py [--runs 21] [--before REF]

Each round runs every variant once, in turn, as a fresh process (wall time from spawn to
exit, output discarded, and the CPU time the process used: user + sys, which a loaded
machine inflates far less than wall time): `python3 -c pass` (the interpreter's own start, with this machine's
site-packages), `python3 -m sandgym --help` from this tree, and with `--before REF` the same
from REF's tree (exported with `git archive`). The table gives medians, the time above the
bare interpreter, and the modules imported (`-X importtime`). Load averages are printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from platform_exec import export_tree  # benchmarks/ is on sys.path when run as a script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv: list[str], tree: str | None) -> tuple[float, float]:
    """(wall s, CPU s) of one run."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=tree or ROOT)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def modules(argv: list[str], tree: str | None) -> int:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    out = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True, cwd=tree or ROOT, check=True)
    return sum(1 for line in out.stderr.splitlines() if line.startswith("import time:") and "| imported package" not in line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--before", metavar="REF")
    args = ap.parse_args()
    py = sys.executable
    variants: dict[str, tuple[list[str], str | None]] = {
        "python3 -c pass": ([py, "-c", "pass"], None),
        "sandgym --help (this tree)": ([py, "-m", "sandgym", "--help"], ROOT),
    }
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        if args.before:
            commit = export_tree(args.before, tmp)
            variants[f"sandgym --help ({args.before}, {commit})"] = ([py, "-m", "sandgym", "--help"], tmp)
        load0 = os.getloadavg()
        times: dict[str, list[float]] = {k: [] for k in variants}
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        for argv, tree in variants.values():
            run(argv, tree)  # warm the page cache and any .pyc
        for _ in range(args.runs):
            for k, (argv, tree) in variants.items():
                wall, used = run(argv, tree)
                times[k].append(wall)
                cpu[k].append(used)
        counts = {k: modules(argv, tree) for k, (argv, tree) in variants.items()}
        load1 = os.getloadavg()
    base = statistics.median(times["python3 -c pass"])
    print(f"runs={args.runs} cpus={os.cpu_count()} load average before {'/'.join(f'{x:.1f}' for x in load0)}, "
          f"after {'/'.join(f'{x:.1f}' for x in load1)}")
    print()
    cbase = statistics.median(cpu["python3 -c pass"])
    print("| command | wall median ms | wall p90 ms | wall above python3 -c pass ms | CPU median ms | CPU above python3 -c pass ms | modules imported |")
    print("|---|---|---|---|---|---|---|")
    for k, ts in times.items():
        xs = sorted(ts)
        p90 = xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]
        c = statistics.median(cpu[k])
        print(f"| {k} | {statistics.median(ts) * 1000:.0f} | {p90 * 1000:.0f} | "
              f"{(statistics.median(ts) - base) * 1000:.0f} | {c * 1000:.0f} | {(c - cbase) * 1000:.0f} | {counts[k]} |")


if __name__ == "__main__":
    main()
