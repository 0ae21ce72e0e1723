"""Rollout overhead: rollouts per second of a trivial single-turn environment against a
zero-latency local OpenAI-compatible endpoint, for sandgym and for verifiers 0.4.0's
in-process eval path, on the same endpoint in the same run, printed as a ratio.

    python benchmarks/rollout_overhead.py [--n 300] [--vf-n 32] [-c 8] [--json]

The endpoint is sandgym's scripted test server (`python -m sandgym.core.testing`, FastAPI
on 127.0.0.1, in its own process) answering every request at once. Each side evaluates
"say hi i" prompts with a reward function that always returns 1, through its own eval
runner, results written to disk as they finish:

- sandgym: `sandgym.core.evaluation.run_eval` with a `SingleTurnEnv` and `OpenAIClient`
  (in this process).
- verifiers 0.4.0: `verifiers.v1.cli.eval.runner.run_eval` (its in-process runner: the
  env lives in the eval process) with a minimal Taskset, the `null` harness and the
  `subprocess` runtime. verifiers 0.4.0 has no harness that runs the chat loop inside the
  eval process: each rollout's chat program is a `uv` script subprocess whose model calls
  go through verifiers' interception server. Its openai<3 pin conflicts with ours, so it
  runs from its own virtualenv (made on first use under ~/.cache/sandgym, from PyPI:
  verifiers==0.4.0 and uv), in a subprocess. Its first run builds the script's uv
  environment; a warm-up run takes that cost out of the measurement.

Only the eval runners' own work is timed (imports and process start are not).
"""

from __future__ import annotations

import argparse
import json
import os
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

VF_RUNNER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from verifiers.v1.configs.cli.eval import EvalConfig
    from verifiers.v1.cli.eval.runner import run_eval

    base_url, n, conc, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ["VFB_N"] = str(n)
    cfg = EvalConfig.model_validate({
        "env": {"taskset": {"id": "vfbench_taskset"},
                "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}},
        "model": "mock",
        "client": {"base_url": base_url, "api_key_var": "VFB_KEY"},
        "num_rollouts": 1, "max_concurrent": conc, "rich": None, "push": False, "output_dir": out,
    })
    t0 = time.perf_counter()
    episodes = asyncio.run(run_eval(cfg))
    wall = time.perf_counter() - t0
    print(json.dumps({"n": len(episodes), "ok": sum(1 for e in episodes if e.ok), "wall_s": wall}))
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
        s = await run_eval(env, client, "mock", output_dir=d, concurrency=concurrency)
    await client.aclose()
    return {"n": s["num_rollouts"], "ok": s["passed"], "errors": s["errors"], "wall_s": s["wall_s"], "rollouts_per_s": s["num_rollouts"] / s["wall_s"]}


def ensure_verifiers_venv() -> Path:
    py = VF_VENV / "bin" / "python"
    if py.exists():
        return py
    print(f"[setup] creating {VF_VENV} with verifiers=={VF_VERSION} and uv from PyPI", file=sys.stderr)
    VF_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VF_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"verifiers=={VF_VERSION}", "uv"], check=True)
    return py


def verifiers_side(py: Path, url: str, n: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    (workdir / "vfbench_taskset.py").write_text(VF_TASKSET)
    (workdir / "run_vf.py").write_text(VF_RUNNER)
    env = {**os.environ, "VFB_KEY": "bench", "PATH": f"{py.parent}:{os.environ.get('PATH', '')}"}
    out = subprocess.run(
        [str(py), str(workdir / "run_vf.py"), url, str(n), str(concurrency), str(workdir / f"out-{n}-{time.time_ns()}")],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"verifiers run failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["rollouts_per_s"] = res["n"] / res["wall_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="sandgym rollouts")
    ap.add_argument("--vf-n", type=int, default=32, help="verifiers rollouts (it is much slower per rollout)")
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("--skip-verifiers", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object last")
    args = ap.parse_args()

    proc, url = start_endpoint()
    result: dict[str, Any] = {"endpoint": url, "concurrency": args.concurrency, "load_avg_1m_start": os.getloadavg()[0]}
    try:
        anyio.run(sandgym_side, url, 20, args.concurrency)  # warm-up (imports, connections)
        result["sandgym"] = anyio.run(sandgym_side, url, args.n, args.concurrency)
        print(f"sandgym   {result['sandgym']['n']:5d} rollouts  {result['sandgym']['wall_s']:8.2f}s  {result['sandgym']['rollouts_per_s']:9.1f} rollouts/s", file=sys.stderr)
        if not args.skip_verifiers:
            py = ensure_verifiers_venv()
            with tempfile.TemporaryDirectory() as d:
                verifiers_side(py, url, 2, 2, Path(d))  # warm-up: builds the chat program's uv env
                result["verifiers"] = verifiers_side(py, url, args.vf_n, args.concurrency, Path(d))
            v = result["verifiers"]
            print(f"verifiers {v['n']:5d} rollouts  {v['wall_s']:8.2f}s  {v['rollouts_per_s']:9.1f} rollouts/s  (ok {v['ok']})", file=sys.stderr)
            result["ratio_sandgym_over_verifiers"] = result["sandgym"]["rollouts_per_s"] / v["rollouts_per_s"]
            print(f"ratio (sandgym / verifiers {VF_VERSION}): {result['ratio_sandgym_over_verifiers']:.1f}x", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    result["load_avg_1m_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
