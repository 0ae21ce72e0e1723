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
    raw: dict[str, dict[str, list[float]]] = {n: {"create": [], "exec": [], "cpu": [], "sys": []} for n in providers}
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=5)
    ap.add_argument("--execs", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pip-reps", type=int, default=3)
    ap.add_argument("--skip-egress", action="store_true")
    args = ap.parse_args()
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rt = anyio.run(bench_runtimes, args)
    why = "skipped by --skip-egress" if args.skip_egress else pypi_reachable()
    eg = anyio.run(bench_egress, args) if why is None else {}
    load1 = os.getloadavg()

    print(f"\n{started}; load average before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, "
          f"after {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f}; {os.cpu_count()} CPUs")
    base = rt.get("strict/runc/loop")
    print("\nruntimes (medians; ratio = / strict/runc/loop)")
    print(f"| {'sandbox':<18} | create-to-ready ms | exec `true` ms | CPU-bound s | syscall-heavy s |")
    print("|" + "---|" * 5)
    for name, m in rt.items():
        def cell(k: str, scale: float, fmt: str, m: dict[str, float] = m) -> str:
            ratio = f" ({m[k] / base[k]:.2f}x)" if base and base[k] else ""
            return f"{m[k] * scale:{fmt}}{ratio}"
        print(f"| {name:<18} | {cell('create', 1000, '.0f')} | {cell('exec', 1000, '.2f')} | "
              f"{cell('cpu', 1, '.3f')} | {cell('sys', 1, '.3f')} |")
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
