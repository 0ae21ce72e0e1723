"""Rollout overhead: rollouts per second of a trivial single-turn environment against a
zero-latency local OpenAI-compatible endpoint -- sandgym next to two configurations of
verifiers 0.4.0 -- at several concurrencies, interleaved in one run, printed with ratios.

    python benchmarks/rollout_overhead.py [--levels 1,8,32] [--rounds 1] [--json]
    python benchmarks/rollout_overhead.py --profile 2000   # sandgym's side under cProfile

The endpoint is sandgym's scripted test server (`python -m sandgym.core.testing`, FastAPI
on 127.0.0.1, in its own process) answering every request at once. Each configuration
evaluates "say hi i" prompts, one model call per rollout, with a reward that always returns
1, through its own eval runner, results written to disk as they finish:

- **sandgym**: `sandgym.core.evaluation.run_eval` with a `SingleTurnEnv` and `OpenAIClient`,
  in this process.
- **verifiers, in-process harness**: verifiers' eval runner
  (`verifiers.v1.cli.eval.runner.run_eval`, the env in the eval process, `subprocess`
  runtime) with a harness written here the way a verifiers user would write one to keep the
  chat loop inside the eval process (`Harness.launch`'s docstring allows it: "a harness may
  run its loop in-process instead of launching a program, as long as every model call goes
  through `endpoint` + `secret`"): each rollout makes its model call with the openai SDK
  against the rollout's interception server, over one shared httpx connection pool, and
  returns a synthetic success. Its best configuration we know of.
- **verifiers, `null` harness**: its built-in chat harness: each rollout's chat program is
  a `uv` script subprocess whose model calls go through the interception server.

verifiers 0.4.0 pins openai<3 and adds ~20 packages that conflict with ours, so its side
runs in its own virtualenv, in one worker subprocess that takes runs one at a time over
stdin: SANDGYM_VF_VENV (e.g. /work/scratch/venv-vf), else ~/.cache/sandgym/
bench-verifiers-0.4.0, made on first use from PyPI (verifiers==0.4.0 and uv; uv is added
to a given venv that lacks it). The null harness builds its script's uv environment on its
first run; a warm-up run of each configuration before the measured ones takes that and the
imports out. For each concurrency the three configurations run back to back (sandgym,
in-process, null; the order reversed on odd rounds), so machine load hits them alike; each
rate is rollouts / the eval runner's wall time (measured around `run_eval` on each side).
With --rounds > 1 the median rate is reported, and each ratio is the median of the
per-round ratios (runs of one round ran back to back, so load drift cancels in the pair).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio

VF_VERSION = "0.4.0"
VF_VENV = Path(os.environ.get("SANDGYM_VF_VENV", Path.home() / ".cache" / "sandgym" / f"bench-verifiers-{VF_VERSION}"))
CONFIGS = ("sandgym", "vf_inprocess", "vf_null")
LABELS = {"sandgym": "sandgym", "vf_inprocess": "verifiers in-process", "vf_null": "verifiers null"}
VF_HARNESS = {"vf_inprocess": "vfbench_inprocess", "vf_null": "null"}

VF_TASKSET = textwrap.dedent(
    """
    import os
    from collections.abc import Iterable

    import verifiers.v1 as vf
    from verifiers.v1.utils.decorators import reward


    class EchoTask(vf.Task):
        @reward
        async def answered(self, trace) -> float:
            return 1.0


    class EchoTaskset(vf.Taskset[EchoTask, vf.TasksetConfig]):
        def load(self) -> Iterable[EchoTask]:
            for i in range(int(os.environ["VFB_N"])):
                yield EchoTask(vf.TaskData(prompt=f"say hi {i}"))


    __all__ = ["EchoTaskset"]
    """
)

# The in-process harness, as a verifiers user would write it.
VF_INPROCESS_HARNESS = textwrap.dedent(
    """
    import asyncio

    import httpx
    import openai
    from verifiers.v1.configs.harness import HarnessConfig
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.harness import Harness
    from verifiers.v1.runtimes import ProgramResult

    _pools = {}  # event loop -> one httpx connection pool for every rollout on it


    class InProcessChatConfig(HarnessConfig):
        pass


    class InProcessChat(Harness[InProcessChatConfig]):
        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_RESUME = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
            system, prompt = self.resolve_prompt(data)
            messages = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            else:
                messages += [message_to_wire(m) for m in prompt or []]
            loop = asyncio.get_running_loop()
            pool = _pools.get(loop)
            if pool is None:
                pool = _pools[loop] = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None))
            client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, http_client=pool, max_retries=0)
            await client.chat.completions.create(model=ctx.model, messages=messages)
            return ProgramResult(exit_code=0, stdout="", stderr="")


    __all__ = ["InProcessChat"]
    """
)

# The verifiers worker: one run per stdin line ({"harness", "n", "c"}), one JSON line back.
VF_WORKER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from verifiers.v1.configs.cli.eval import EvalConfig
    from verifiers.v1.cli.eval.runner import run_eval

    base_url, workdir = sys.argv[1], sys.argv[2]
    for k, line in enumerate(sys.stdin):
        req = json.loads(line)
        os.environ["VFB_N"] = str(req["n"])
        cfg = EvalConfig.model_validate({
            "env": {"taskset": {"id": "vfbench_taskset"},
                    "agent": {"harness": {"id": req["harness"]}, "runtime": {"type": "subprocess"}}},
            "model": "mock",
            "client": {"base_url": base_url, "api_key_var": "VFB_KEY"},
            "num_rollouts": 1, "max_concurrent": req["c"], "rich": None, "push": False,
            "output_dir": os.path.join(workdir, f"out-{k}"),
        })
        t0 = time.perf_counter()
        episodes = asyncio.run(run_eval(cfg))
        wall = time.perf_counter() - t0
        print(json.dumps({"n": len(episodes), "ok": sum(1 for e in episodes if e.ok), "wall_s": wall}), flush=True)
    """
)


def start_endpoint() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "sandgym.core.testing"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError(f"endpoint did not start: {url!r}")
    return proc, url


async def sandgym_side(url: str, n: int, concurrency: int) -> dict[str, Any]:
    from sandgym.core.clients import OpenAIClient
    from sandgym.core.environment import SingleTurnEnv
    from sandgym.core.evaluation import run_eval
    from sandgym.core.rubric import Rubric

    def answered(completion: list[dict[str, Any]]) -> float:
        return 1.0

    env = SingleTurnEnv(eval_dataset=[{"question": f"say hi {i}", "answer": "ok"} for i in range(n)], rubric=Rubric([answered]))
    client = OpenAIClient(url, max_retries=0)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        s = await run_eval(env, client, "mock", output_dir=d, concurrency=concurrency)
        wall = time.perf_counter() - t0
    await client.aclose()
    return {"n": s["num_rollouts"], "ok": s["passed"], "wall_s": wall}


def profile_sandgym(url: str, n: int, concurrency: int) -> None:
    """One sandgym run under cProfile: the share of run time (tottime) by package, and
    sandgym's own functions that cost most."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    r = anyio.run(sandgym_side, url, n, concurrency)
    prof.disable()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    pkgs = ("sandgym", "openai", "httpx", "httpx2", "httpcore", "h11", "pydantic", "anyio", "asyncio", "json")
    share: dict[str, float] = {}
    for (path, _, _), (_, _, tt, _, _) in st.stats.items():  # type: ignore[attr-defined]
        parts = Path(path).parts
        key = next((p for p in pkgs if p in parts), "other (C builtins: sockets, ...; typing, ...)")
        share[key] = share.get(key, 0.0) + tt
    print(f"{r['n']} rollouts at c={concurrency} under cProfile, {r['n'] / r['wall_s']:.1f} rollouts/s; tottime by package:")
    for k, v in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"  {k:10s} {v:7.3f}s {100 * v / total:5.1f}%")
    st.sort_stats("tottime").print_stats(r"[/\\]sandgym[/\\]", 10)


def ensure_verifiers_venv() -> Path:
    py = VF_VENV / "bin" / "python"
    if not py.exists():
        print(f"[setup] creating {VF_VENV} with verifiers=={VF_VERSION} and uv from PyPI", file=sys.stderr)
        VF_VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VF_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", f"verifiers=={VF_VERSION}", "uv"], check=True)
    found = subprocess.run([str(py), "-c", "import verifiers; print(verifiers.__version__)"], capture_output=True, text=True, cwd="/")
    if found.stdout.strip() != VF_VERSION:
        raise SystemExit(f"{VF_VENV} has verifiers {found.stdout.strip() or '(none)'}, not {VF_VERSION}: {found.stderr[-500:]}")
    if not (VF_VENV / "bin" / "uv").exists() and shutil.which("uv") is None:
        print(f"[setup] adding uv (for the null harness's chat program) to {VF_VENV}", file=sys.stderr)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "uv"], check=True)
    return py


class VerifiersWorker:
    """The verifiers side: a worker process in verifiers' venv that runs one eval per request."""

    def __init__(self, py: Path, url: str, workdir: Path) -> None:
        (workdir / "vfbench_taskset.py").write_text(VF_TASKSET)
        (workdir / "vfbench_inprocess.py").write_text(VF_INPROCESS_HARNESS)
        (workdir / "vf_worker.py").write_text(VF_WORKER)
        env = {**os.environ, "VFB_KEY": "bench", "PATH": f"{py.parent}:{os.environ.get('PATH', '')}"}
        env.pop("PYTHONPATH", None)  # nothing of ours in verifiers' interpreter
        self.proc = subprocess.Popen(
            [str(py), str(workdir / "vf_worker.py"), url, str(workdir)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=open(workdir / "vf_worker.log", "w"), text=True, env=env, cwd=workdir,
        )  # fmt: skip
        self.log = workdir / "vf_worker.log"

    def run(self, harness: str, n: int, concurrency: int) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"harness": harness, "n": n, "c": concurrency}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"verifiers worker died:\n{self.log.read_text()[-3000:]}")
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def rollouts_for(config: str, concurrency: int, args: argparse.Namespace) -> int:
    # Several waves at every concurrency; the slow null harness gets fewer rollouts.
    if config == "sandgym":
        return max(args.n, 8 * concurrency)
    if config == "vf_inprocess":
        return max(args.vf_n, 8 * concurrency)
    return max(args.null_n, 2 * concurrency)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,8,32", help="concurrencies, comma-separated")
    ap.add_argument("--rounds", type=int, default=1, help="passes over the levels (median reported)")
    ap.add_argument("--n", type=int, default=600, help="sandgym rollouts per run (at least 8 x concurrency)")
    ap.add_argument("--vf-n", type=int, default=300, help="verifiers in-process rollouts per run (at least 8 x c)")
    ap.add_argument("--null-n", type=int, default=24, help="verifiers null-harness rollouts per run (at least 2 x c)")
    ap.add_argument("--skip-verifiers", action="store_true")
    ap.add_argument("--profile", type=int, metavar="N", help="only profile a sandgym run of N rollouts at c=8")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object last")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    configs = ("sandgym",) if args.skip_verifiers else CONFIGS

    proc, url = start_endpoint()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {c: {lv: [] for lv in levels} for c in configs}
    result: dict[str, Any] = {"endpoint": url, "levels": levels, "rounds": args.rounds, "cpus": os.cpu_count(),
                              "load_avg_start": os.getloadavg()}  # fmt: skip
    worker: VerifiersWorker | None = None
    workdir = Path(tempfile.mkdtemp(prefix="rollout-overhead-"))
    try:
        anyio.run(sandgym_side, url, 50, 8)  # warm-up (imports, connections)
        if args.profile:
            profile_sandgym(url, args.profile, 8)
            return
        if not args.skip_verifiers:
            worker = VerifiersWorker(ensure_verifiers_venv(), url, workdir)
            for harness in VF_HARNESS.values():  # warm-up: imports, the null harness's uv env
                worker.run(harness, 4, 2)

        def one(config: str, level: int) -> None:
            n = rollouts_for(config, level, args)
            if config == "sandgym":
                r = anyio.run(sandgym_side, url, n, level)
            else:
                assert worker is not None
                r = worker.run(VF_HARNESS[config], n, level)
            r["rollouts_per_s"] = r["n"] / r["wall_s"]
            runs[config][level].append(r)
            print(f"c={level:<3d} {LABELS[config]:22s} {r['n']:5d} rollouts ({r['ok']} ok) {r['wall_s']:8.2f}s "
                  f"{r['rollouts_per_s']:9.1f} rollouts/s", file=sys.stderr)  # fmt: skip

        for rnd in range(args.rounds):
            for level in levels:
                for config in configs if rnd % 2 == 0 else tuple(reversed(configs)):
                    one(config, level)
    finally:
        if worker is not None:
            worker.close()
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    result["load_avg_end"] = os.getloadavg()

    rate = {c: {lv: statistics.median(r["rollouts_per_s"] for r in runs[c][lv]) for lv in levels} for c in configs}

    def ratio(other: str, lv: int) -> float:
        return statistics.median(a["rollouts_per_s"] / b["rollouts_per_s"] for a, b in zip(runs["sandgym"][lv], runs[other][lv]))

    result["runs"] = runs
    result["rollouts_per_s"] = rate
    if not args.skip_verifiers:
        result["ratio"] = {other: {lv: ratio(other, lv) for lv in levels} for other in ("vf_inprocess", "vf_null")}
    lines = [f"{'concurrency':>11s}" + "".join(f"{LABELS[c]:>24s}" for c in configs)
             + ("" if args.skip_verifiers else f"{'sandgym / in-process':>22s}{'sandgym / null':>16s}")]  # fmt: skip
    for lv in levels:
        row = f"{lv:>11d}" + "".join(f"{rate[c][lv]:>17.1f} roll/s" for c in configs)
        if not args.skip_verifiers:
            row += f"{result['ratio']['vf_inprocess'][lv]:>21.1f}x{result['ratio']['vf_null'][lv]:>15.0f}x"
        lines.append(row)
    loads = f"load average (1, 5, 15 min) at start {result['load_avg_start']}, at end {result['load_avg_end']}"
    print("\n".join([f"rollouts per second, {args.rounds} round(s); {loads}", *lines]))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
