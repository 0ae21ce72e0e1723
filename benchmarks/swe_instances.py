"""Real SWE-bench instances: seconds per instance, cold and warm, gold and empty patch.

    SANDGYM_SWE_ROWS=rows.jsonl SANDGYM_SWE_MIRRORS=mirrors/ \\
        python benchmarks/swe_instances.py [--runs 2] [-c 2] [--cold] [-o DIR]

Runs `sandgym swe validate` on the rows (gold patch then empty patch, `--runs` times
each, every run written to DIR; `--empty-first` swaps the order): cold = the first run,
the one that built the instance image (with
`--cold`, the instance and env images are removed first, so it includes the env layer
unless a sibling instance built the same env first), warm = the mean of the runs on the
reused image. Baseline, measured in the same run: the instance image alone with
`docker run --network none` doing what the harness's test phase does (apply the test
patch, run the test command), no sandbox, no setup copy, no grading. ratio = sandgym's
warm empty-patch run / that baseline. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from sandgym.sandboxes.manager import SandboxManager
from sandgym.swe.evaluate import eval_script
from sandgym.swe.images import TaskImageBuilder
from sandgym.swe.store import RunStore
from sandgym.swe.tasks import load_tasks
from sandgym.swe.validate import Validator, validation_summary


def remove_images(builder: TaskImageBuilder, tasks: list[Any]) -> list[str]:
    import docker.errors

    gone = []
    for t in tasks:
        t = builder.resolve(t)
        if t.recipe is None:
            continue
        for tag in (builder.instance_tag(t)[0], builder.env_tag(t.recipe)[0]):
            try:
                builder.client.images.remove(tag, force=True)
                gone.append(tag)
            except docker.errors.ImageNotFound:
                pass
    return gone


def raw_test_run(image: str, task: Any) -> tuple[float, int]:
    """The baseline: apply the test patch and run the eval script in the image, nothing else."""
    script = "cd /testbed && git apply --whitespace=nowarn /dev/stdin && bash /dev/fd/3 3<<'SANDGYM_EOF'\n" + eval_script(task) + "SANDGYM_EOF\n"
    t0 = time.perf_counter()
    p = subprocess.run(["docker", "run", "-i", "--rm", "--network", "none", "--user", "root", image, "bash", "-c", script],
                       input=task.test_patch, capture_output=True, text=True)
    return time.perf_counter() - t0, p.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("-c", "--concurrency", type=int, default=2)
    ap.add_argument("--cold", action="store_true", help="remove the instance and env images first")
    ap.add_argument("-o", "--output", type=Path, default=None)
    ap.add_argument("-i", "--instance", action="append", default=None)
    ap.add_argument("--empty-first", action="store_true", help="run the empty patch first (its run is then the cold one)")
    args = ap.parse_args()
    rows, mirrors = os.environ.get("SANDGYM_SWE_ROWS"), os.environ.get("SANDGYM_SWE_MIRRORS")
    if not rows or not mirrors:
        sys.exit("set SANDGYM_SWE_ROWS (genuine rows) and SANDGYM_SWE_MIRRORS (bare mirrors)")
    tasks = load_tasks(rows, instance_ids=args.instance)
    builder = TaskImageBuilder(mirrors=mirrors)
    if args.cold:
        print(f"removed {len(remove_images(builder, tasks))} images", file=sys.stderr)
    out = args.output or Path("runs") / f"bench-swe-{time.strftime('%Y%m%d-%H%M%S')}"
    store = RunStore(out)
    store.start({"kind": "validate", "step": "gold+none", "runs": args.runs, "tasks": rows, "argv": sys.argv[1:]})

    async def go() -> list[Any]:
        async with SandboxManager("docker", max_sandboxes=args.concurrency) as mgr:
            steps = ("none", "gold_patch") if args.empty_first else ("gold_patch", "none")
            v = Validator(mgr, builder=builder, store=store, runs=args.runs, steps=steps,
                          progress=lambda i, p: print(f"  {i}: {p}", file=sys.stderr) if p == "done" else None)
            return await v.run(tasks, args.concurrency)

    t0 = time.perf_counter()
    vals = anyio.run(go)
    wall = time.perf_counter() - t0
    summ = validation_summary(vals, args.runs, wall)
    raw: dict[str, tuple[float, int]] = {}
    for t in tasks:  # one at a time: the baseline gets the machine to itself
        t = builder.resolve(t)
        raw[t.instance_id] = raw_test_run(builder.instance_tag(t)[0], t)
    summ["baseline_raw_docker_s"] = {k: round(v[0], 2) for k, v in raw.items()}
    (out / "benchmark.json").write_text(json.dumps(summ, indent=2) + "\n")

    print(f"\n{len(tasks)} instances, {args.runs} run(s) of gold and empty each, -c {args.concurrency}; "
          f"wall {wall:.0f}s; results in {out}")
    cold = "cold empty s" if args.empty_first else "cold gold s"
    print(f"| instance | repo | version | python | gold | empty | {cold} | gold warm s | empty warm s | raw docker s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for v in vals:
        r = raw[v.instance_id][0]
        ratio = f"{v.empty_warm_s / r:.2f}" if v.empty_warm_s else "-"

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f}"

        print(f"| {v.instance_id} | {v.repo} | {v.version} | {v.python} | {v.gold_resolved}/{v.runs} | "
              f"{v.empty_resolved}/{v.runs} | {f(v.cold_s)} | {f(v.gold_warm_s)} | {f(v.empty_warm_s)} | {r:.1f} | {ratio} |")
    print(f"valid {summ['valid']}/{summ['total']}")


if __name__ == "__main__":
    main()
