"""Fleet overhead and node-failure recovery: HumanEval's oracle on one machine, on a 1-node
Ray cluster and on a simulated 3-node Ray cluster -- all on THIS machine (one set of cores,
one Docker engine), so the ratios measure what Ray and the node agents cost, not capacity.

    python benchmarks/fleet_overhead.py [--rounds 2] [--concurrency 8] [--cap 4] [--kills 2]

Per round, in alternating order (load averages printed per measurement):
- `local`: `sandgym eval humaneval --policy oracle -c C` (no Ray; the baseline);
- `ray-1`: the same with `--ray ADDRESS` on a 1-node cluster (node cap `--cap`);
- `ray-3`: the same on a 3-node cluster (each node cap `--cap`; -c C in all).
Each cluster gets one warm-up eval first (agents start, the environment loads, pools fill);
the timed runs are warm. problems/s = 164 / the eval's own wall time (`wall_s`).

Node death (`--kills` runs on the 3-node cluster): the eval runs as above; after 40 records
one node (not the head) is SIGKILLed (its raylet and its agent) and started again at once.
Printed: detection (kill -> the driver marks the node lost), recovery (kill -> the last
rollout that was retried elsewhere finished), how many rollouts were retried, the run's
wall time against a warm run without a kill, and whether the run ended 164/164.

Also: exec round trip (`true`) p50/p95 through a `RaySandbox` (driver -> node agent -> execd)
vs a docker sandbox of a local SandboxManager (driver -> execd), calls interleaved.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N = 164


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def eval_cmd(out: str, concurrency: int, address: str | None, n: int = -1) -> list[str]:
    cmd = [sys.executable, "-m", "sandgym", "eval", "humaneval", "--policy", "oracle", "-c", str(concurrency),
           "-n", str(n), "--json", "-o", out]
    return cmd + (["--ray", address] if address else [])


def run_eval(concurrency: int, address: str | None, n: int = -1) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as d:
        t = time.perf_counter()
        p = subprocess.run(eval_cmd(d, concurrency, address, n), capture_output=True, text=True, env=env())
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-3000:])
        s = json.loads(p.stdout.strip().splitlines()[-1])
    return {"wall_s": s["wall_s"], "command_wall_s": wall, "passed": s["passed"], "n": s["num_rollouts"],
            "errors": s["errors"], "per_s": s["num_rollouts"] / s["wall_s"]}


def records(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def run_with_kill(cluster: object, concurrency: int, victim: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-fleet-kill-") as d:
        out = Path(d)
        proc = subprocess.Popen(eval_cmd(d, concurrency, cluster.address), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env())
        while len(records(out)) < 40:
            if proc.poll() is not None:
                raise RuntimeError(proc.communicate()[1][-3000:])
            time.sleep(0.02)
        killed_at = time.time()
        cluster.kill_node(victim)
        cluster.add_node(victim)
        stdout, stderr = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(stderr[-3000:])
        s = json.loads(stdout.strip().splitlines()[-1])
        recs = records(out)
    lost = [e for e in s["fleet"]["events"] if e["event"] == "lost"]
    retried = [r for r in recs if r["info"]["fleet"]["retries"]]
    last_retry_done = max((r["info"]["fleet"]["finished_at"] for r in retried), default=None)
    return {
        "wall_s": s["wall_s"], "passed": s["passed"], "n": s["num_rollouts"], "errors": s["errors"],
        "detect_s": (lost[0]["time"] - killed_at) if lost else None,
        "recover_s": (last_retry_done - killed_at) if last_retry_done else None,
        "retried": len(retried), "pruned": s["fleet"]["pruned"],
    }


async def exec_round_trips(address: str, runs: int) -> dict[str, list[float]]:
    from sandgym.sandboxes import SandboxManager, SandboxSpec

    spec = SandboxSpec(cpu=0.5, memory_mb=256, disk_mb=32)
    out: dict[str, list[float]] = {"ray": [], "docker": []}
    async with SandboxManager("ray", max_sandboxes=1, provider_options={"address": address}) as rm, \
            SandboxManager("docker", max_sandboxes=1) as dm:
        async with rm.sandbox(spec) as rs, dm.sandbox(spec) as ds:
            for _ in range(10):
                await rs.exec(["true"])
                await ds.exec(["true"])
            for _ in range(runs):
                for key, sb in (("ray", rs), ("docker", ds)):
                    t = time.perf_counter()
                    r = await sb.exec(["true"])
                    out[key].append(time.perf_counter() - t)
                    assert r.exit_code == 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--cap", type=int, default=4)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--exec-runs", type=int, default=200)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import anyio

    from sandgym.sandboxes.providers.ray.cluster import LocalCluster

    c = args.concurrency
    print(f"cpus={os.cpu_count()} load={load()} concurrency={c} node cap={args.cap}", flush=True)
    runs: dict[str, list[dict]] = {"local": [], "ray-1": [], "ray-3": []}
    kills: list[dict] = []
    rt: dict[str, list[float]] = {}
    prefix = f"b{os.getpid()}"
    for rnd in range(args.rounds):
        order = ["local", "ray-1", "ray-3"] if rnd % 2 == 0 else ["ray-3", "ray-1", "local"]
        for what in order:
            cluster = None
            if what != "local":
                names = [f"{prefix}r{rnd}{what[-1]}n{i}" for i in range(int(what[-1]))]
                t = time.perf_counter()
                cluster = LocalCluster(names, max_sandboxes_per_node=args.cap)
                cluster.start()
                warm = run_eval(c, cluster.address, n=40)
                print(f"round {rnd + 1} {what}: cluster up in {time.perf_counter() - t:.1f} s incl. warm-up "
                      f"({warm['n']} rollouts, {warm['wall_s']:.2f} s)", flush=True)
            try:
                before = load()
                res = run_eval(c, cluster.address if cluster else None)
                res["load"] = f"{before} -> {load()}"
                runs[what].append(res)
                print(f"round {rnd + 1} {what:6} {res['passed']}/{res['n']} passed, {res['wall_s']:.2f} s -> "
                      f"{res['per_s']:.1f}/s (command {res['command_wall_s']:.2f} s)  load {res['load']}", flush=True)
                if cluster and what == "ray-1" and not rt:
                    from sandgym.sandboxes.providers.ray.cluster import connect

                    connect(cluster.address)
                    rt = anyio.run(exec_round_trips, cluster.address, args.exec_runs)
                if cluster and what == "ray-3" and rnd == args.rounds - 1:
                    for k in range(args.kills):
                        before = load()
                        kr = run_with_kill(cluster, c, names[1 + k % 2])
                        kr["load"] = f"{before} -> {load()}"
                        kills.append(kr)
                        print(f"kill {k + 1}: {kr['passed']}/{kr['n']} passed, errors {kr['errors']}, detect "
                              f"{kr['detect_s']:.2f} s, recover {kr['recover_s']:.2f} s, {kr['retried']} retried, "
                              f"wall {kr['wall_s']:.2f} s, pruned {kr['pruned']}  load {kr['load']}", flush=True)
            finally:
                if cluster:
                    cluster.shutdown()

    def best(k: str) -> dict:
        return max(runs[k], key=lambda r: r["per_s"])

    base = best("local")
    print()
    print(f"| setup (same machine, {os.cpu_count()} cores) | problems/s (best of {args.rounds}) | wall s | vs local |")
    print("| --- | --- | --- | --- |")
    for k, label in (("local", "one machine, no Ray"), ("ray-1", "Ray, 1 node"), ("ray-3", "Ray, 3 simulated nodes")):
        b = best(k)
        print(f"| {label} | {b['per_s']:.1f} ({b['passed']}/{b['n']}) | {b['wall_s']:.2f} | {b['per_s'] / base['per_s']:.2f} |")
    if rt:
        r, d = rt["ray"], rt["docker"]
        print(f"| exec `true` p50 / p95, ms: RaySandbox | {statistics.median(r) * 1e3:.2f} / {pct(r, .95) * 1e3:.2f} | "
              f"docker | {statistics.median(d) * 1e3:.2f} / {pct(d, .95) * 1e3:.2f} |")
    for i, k in enumerate(kills):
        warm3 = best("ray-3")["wall_s"]
        print(f"| node killed after 40 records (run {i + 1}) | {k['passed']}/{k['n']}, errors {k['errors']} | "
              f"{k['wall_s']:.2f} | detect {k['detect_s']:.2f} s, last retried rollout done {k['recover_s']:.2f} s "
              f"after the kill, {k['retried']} retried; wall x{k['wall_s'] / warm3:.2f} of a run without a kill |")


if __name__ == "__main__":
    main()
