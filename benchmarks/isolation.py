"""gVisor vs runc, per-sandbox disks vs tmpfs, and the egress proxy's cost, in one run.

    python benchmarks/isolation.py [--creates 5] [--execs 50] [--reps 3] [--pip-reps 3]

Sandbox configurations, all through `DockerProvider` (execd transport), created in turn
within each iteration so they share the machine's load:
  strict/runc/tmpfs   the old default: workdir and /tmp on tmpfs (DockerProvider(disk="tmpfs"))
  strict/runc/loop    the new default: a per-sandbox ext4 disk (runtime runc-sandgym)
  strict/gVisor       strict under runsc (DockerProvider(runtime="runsc"))
  vm/gVisor           profile vm: root, a writable overlay root on its disk, under runsc
Measured: create-to-ready (create + first `true`), exec round trip of `true`, a CPU-bound
program (300k sha256 in python) and a syscall-heavy one (100k os.stat). Ratios are against
strict/runc/loop (what a sandbox costs today).

Also the floor of any exec path: inside each sandbox, `posix_spawn("/bin/true")` + wait,
50 times, timed by the sandbox itself (no host, no execd).

    python benchmarks/isolation.py --before REF [--rounds 2] [--creates 5] [--execs 50] [--reps 3]

measures the runtimes part with this script against REF's library (its tree exported with
`git archive`, imported through PYTHONPATH) and this tree's, in alternating subprocesses
(before, after, after, before, ...), and prints both tables and the ratios vm/strict of
each. Egress is left out in that mode.

Egress: `pip download requests==2.32.3` (5 wheels, no cache) from the host directly vs from
a strict/runc and a vm/gVisor sandbox through relay -> forwarder -> squid, alternating; and
20 HTTPS GETs of https://pypi.org/simple/six/ (new connection each). Skipped when PyPI is
unreachable. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import anyio

from sandgym.sandboxes import EgressPolicy, SandboxSpec
from sandgym.sandboxes.ownership import owner_labels
from sandgym.sandboxes.providers.docker import DockerProvider

CPU = "import hashlib\nh=b'x'\nfor _ in range(300000): h=hashlib.sha256(h).digest()"
SYSCALLS = "import os\nfor _ in range(100000): os.stat('/')"
SPAWN = ("import os, statistics, time\nxs = []\nfor _ in range(53):\n    t = time.monotonic()\n"
         "    os.waitpid(os.posix_spawn('/bin/true', ['true'], {}), 0)\n    xs.append(time.monotonic() - t)\n"
         "print(statistics.median(xs[3:]))")
GETS = ("import time, urllib.request\nts=[]\nfor _ in range(20):\n    t=time.perf_counter()\n"
        "    urllib.request.urlopen('https://pypi.org/simple/six/', timeout=30).read()\n"
        "    ts.append(time.perf_counter()-t)\nts.sort(); print(ts[len(ts)//2])")
PIP = ["pip", "download", "-q", "--no-cache-dir", "--retries", "0", "-d", "{dir}", "requests==2.32.3"]
LABELS = owner_labels("bench-isolation")


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def bench_runtimes(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    base = SandboxSpec(memory_mb=512, disk_mb=256, ttl_s=900, exec_timeout_s=120)
    providers = {
        "strict/runc/tmpfs": (DockerProvider(disk="tmpfs"), base),
        "strict/runc/loop": (DockerProvider(), base),
        "strict/gVisor": (DockerProvider(runtime="runsc"), base),
        "vm/gVisor": (DockerProvider(), base.model_copy(update={"profile": "vm"})),
    }
    for name, (p, spec) in list(providers.items()):
        try:
            p.check(spec)
        except Exception as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
            del providers[name]
    raw: dict[str, dict[str, list[float]]] = {n: {"create": [], "exec": [], "cpu": [], "sys": [], "spawn": []} for n in providers}
    live = {}
    try:
        for _ in range(args.creates):  # interleaved: every configuration sees the same load
            for name, (p, spec) in providers.items():
                t = time.perf_counter()
                sb = await p.create(spec, LABELS)
                r = await sb.exec(["true"])
                raw[name]["create"].append(time.perf_counter() - t)
                assert r.exit_code == 0, r
                await sb.close()
        for name, (p, spec) in providers.items():
            live[name] = await p.create(spec, LABELS)
            for _ in range(5):
                await live[name].exec(["true"])
        for _ in range(args.execs):
            for name, sb in live.items():
                t = time.perf_counter()
                await sb.exec(["true"])
                raw[name]["exec"].append(time.perf_counter() - t)
        for _ in range(args.reps):
            for name, sb in live.items():
                r = await sb.exec(["python3", "-c", SPAWN], timeout=300)
                assert r.exit_code == 0, r.stderr
                raw[name]["spawn"].append(float(r.stdout))
            for key, code in (("cpu", CPU), ("sys", SYSCALLS)):
                for name, sb in live.items():
                    t = time.perf_counter()
                    r = await sb.exec(["python3", "-c", code], timeout=300)
                    raw[name][key].append(time.perf_counter() - t)
                    assert r.exit_code == 0, r.stderr
    finally:
        for sb in live.values():
            await sb.close()
        for p, _ in providers.values():
            await p.aclose()
    return {n: {k: med(v) for k, v in d.items()} for n, d in raw.items()}


def pypi_reachable() -> str | None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10).close()
    except Exception as exc:
        return repr(exc)
    return None


async def bench_egress(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    policy = EgressPolicy(allow=["pypi.org", "*.pythonhosted.org"])
    spec = SandboxSpec(memory_mb=1024, disk_mb=512, ttl_s=900, exec_timeout_s=300, egress=policy)
    p = DockerProvider()
    boxes = {"sandbox strict/runc": await p.create(spec, LABELS)}
    try:
        p.check(spec.model_copy(update={"profile": "vm"}))
        boxes["sandbox vm/gVisor"] = await p.create(spec.model_copy(update={"profile": "vm"}), LABELS)
    except Exception as exc:
        print(f"skipping vm/gVisor egress: {exc}", file=sys.stderr)
    out: dict[str, dict[str, list[float]]] = {"host, direct": {"pip": [], "get": []}}
    out.update({n: {"pip": [], "get": []} for n in boxes})
    pip = shutil.which("pip") or "pip"
    # The host's pip as a sandbox's runs: no local wheel dirs or config, only the CA bundle.
    host_env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    host_env.update(PIP_CONFIG_FILE=os.devnull, PIP_CERT="/etc/ssl/certs/ca-certificates.crt",
                    PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        for _ in range(args.pip_reps):
            d = tempfile.mkdtemp(prefix="bench-pip-")
            t = time.perf_counter()
            subprocess.run([pip if a == "pip" else a.format(dir=d) for a in PIP], check=True, env=host_env)
            out["host, direct"]["pip"].append(time.perf_counter() - t)
            shutil.rmtree(d)
            r = subprocess.run([sys.executable, "-c", GETS], capture_output=True, text=True, check=True)
            out["host, direct"]["get"].append(float(r.stdout))
            for name, sb in boxes.items():
                t = time.perf_counter()
                r = await sb.exec(["sh", "-c", "rm -rf /tmp/dl && " + " ".join(PIP).format(dir="/tmp/dl")], timeout=300)
                out[name]["pip"].append(time.perf_counter() - t)
                assert r.exit_code == 0, r.stderr[-2000:]
                r = await sb.exec(["python3", "-c", GETS], timeout=300)
                assert r.exit_code == 0, r.stderr[-2000:]
                out[name]["get"].append(float(r.stdout))
    finally:
        for sb in boxes.values():
            await sb.close()
        await p.aclose()
    return {n: {k: med(v) for k, v in d.items()} for n, d in out.items()}


def print_runtimes(rt: dict[str, dict[str, float]], title: str) -> None:
    base = rt.get("strict/runc/loop")
    print(f"\n{title} (medians; ratio = / strict/runc/loop)")
    print(f"| {'sandbox':<18} | create-to-ready ms | exec `true` ms | spawn floor ms | CPU-bound s | syscall-heavy s |")
    print("|" + "---|" * 6)
    for name, m in rt.items():
        def cell(k: str, scale: float, fmt: str, m: dict[str, float] = m) -> str:
            ratio = f" ({m[k] / base[k]:.2f}x)" if base and base.get(k) else ""
            return f"{m[k] * scale:{fmt}}{ratio}"
        print(f"| {name:<18} | {cell('create', 1000, '.0f')} | {cell('exec', 1000, '.2f')} | "
              f"{cell('spawn', 1000, '.2f')} | {cell('cpu', 1, '.3f')} | {cell('sys', 1, '.3f')} |")


def before_after(args: argparse.Namespace) -> None:
    """This script's runtimes part against REF's library and this tree's, alternating."""
    import json

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from platform_exec import export_tree

    with tempfile.TemporaryDirectory(prefix="bench-before-") as tree:
        commit = export_tree(args.before, tree)
        trees = {f"before ({args.before}, {commit})": tree, "after (this tree)": here}
        runs: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in trees}
        loads = []
        for rnd in range(args.rounds):
            for label in (list(trees) if rnd % 2 == 0 else list(trees)[::-1]):
                env = {**os.environ, "PYTHONPATH": trees[label]}
                cmd = [sys.executable, os.path.abspath(__file__), "--runtimes-json", "--creates", str(args.creates),
                       "--execs", str(args.execs), "--reps", str(args.reps)]
                l0 = os.getloadavg()
                out = subprocess.run(cmd, env=env, cwd=trees[label], capture_output=True, text=True, check=True)
                loads.append(f"round {rnd + 1} {label}: load {l0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
                runs[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; rounds={args.rounds} "
          f"creates={args.creates} execs={args.execs} reps={args.reps}")
    for line in loads:
        print("  " + line)
    summary = {}
    for label, rs in runs.items():
        med_rt = {n: {k: med([r[n][k] for r in rs]) for k in rs[0][n]} for n in rs[0]}
        summary[label] = med_rt
        print_runtimes(med_rt, f"{label}, median over rounds")
    print("\nvm/gVisor / strict/runc/loop, before -> after")
    print("| measure | before | after |")
    print("|---|---|---|")
    (b, a) = summary.values()
    for k, name in (("create", "create-to-ready"), ("exec", "exec `true` p50"), ("spawn", "spawn floor"),
                    ("cpu", "CPU-bound"), ("sys", "syscall-heavy")):
        rb = b["vm/gVisor"][k] / b["strict/runc/loop"][k]
        ra = a["vm/gVisor"][k] / a["strict/runc/loop"][k]
        print(f"| {name} | {rb:.2f}x | {ra:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=5)
    ap.add_argument("--execs", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pip-reps", type=int, default=3)
    ap.add_argument("--skip-egress", action="store_true")
    ap.add_argument("--before", metavar="REF", help="runtimes only: REF's library vs this tree's, alternating")
    ap.add_argument("--rounds", type=int, default=2, help="with --before: subprocess runs per side")
    ap.add_argument("--runtimes-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.runtimes_json:
        import json

        print(json.dumps(anyio.run(bench_runtimes, args)))
        return
    if args.before:
        before_after(args)
        return
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rt = anyio.run(bench_runtimes, args)
    why = "skipped by --skip-egress" if args.skip_egress else pypi_reachable()
    eg = anyio.run(bench_egress, args) if why is None else {}
    load1 = os.getloadavg()

    print(f"\n{started}; load average before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, "
          f"after {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f}; {os.cpu_count()} CPUs")
    print_runtimes(rt, "runtimes")
    if eg:
        host = eg["host, direct"]
        print("\negress (medians; ratio = / host, direct)")
        print("| path | pip download requests (5 wheels) s | HTTPS GET p50 ms |")
        print("|---|---|---|")
        for name, m in eg.items():
            print(f"| {name} | {m['pip']:.2f} ({m['pip'] / host['pip']:.2f}x) | "
                  f"{m['get'] * 1000:.1f} ({m['get'] / host['get']:.2f}x) |")
    else:
        print(f"\negress: skipped ({why})")


if __name__ == "__main__":
    main()
