"""BFCL v4: sandgym's per-category accuracy next to `bfcl evaluate`'s, on the same outputs.

    python benchmarks/bfcl_agreement.py [--policies oracle,imperfect] [--per-category N] [--out DIR]

For each policy: `bfcl_v4_single_turn` and `bfcl_v4_multi_turn` are run (all categories,
or N entries of each), the records are exported as BFCL result files (sandgym.bfcl.export)
and BFCL's own CLI scores them (`bfcl evaluate --model gpt-4o-2024-11-20-FC ...` in a
sandgym/bfcl sandbox). Policies: `oracle` (replays the ground truth), `imperfect` (the oracle
wrong on one step in three: sandgym.bfcl.imperfect), `null`. The table comes last: per
category, sandgym's accuracy and `bfcl evaluate`'s, and whether the (correct, total) counts
agree exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import anyio


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


async def run_policy(policy: str, per_category: int | None, out: Path, concurrency: int) -> dict:
    from sandgym import envs
    from sandgym.bfcl.export import bfcl_evaluate, compare, export_results, is_partial, load_records
    from sandgym.bfcl.imperfect import ImperfectOracle
    from sandgym.core.evaluation import run_eval
    from sandgym.core.policies import get_policy

    run_dirs = []
    timings = {}
    for kind in ("single_turn", "multi_turn"):
        env = envs.load_environment(f"bfcl_v4_{kind}", per_category=per_category)
        client = ImperfectOracle(env) if policy == "imperfect" else get_policy(policy, env)
        d = out / f"{policy}_{kind}"
        t0 = time.perf_counter()
        s = await run_eval(env, client, policy, output_dir=d, concurrency=concurrency)
        timings[kind] = time.perf_counter() - t0
        print(f"{policy} {kind}: {s['num_rollouts']} rollouts, reward {s['reward_mean']:.4f}, errors {s['errors']}, "
              f"{timings[kind]:.0f} s, load {load()}", flush=True)
        if s["errors"]:
            raise SystemExit(f"{policy} {kind}: {s['errors']} rollouts failed ({s['error_kinds']}); see {d}")
        run_dirs.append(d)
    records = load_records(run_dirs)
    root = out / f"{policy}_bfcl"
    counts = export_results(records, root)
    t0 = time.perf_counter()
    ev = await bfcl_evaluate(root, list(counts), partial=is_partial(counts))
    timings["bfcl_evaluate"] = time.perf_counter() - t0
    print(f"{policy}: `{ev.command}` {timings['bfcl_evaluate']:.0f} s", flush=True)
    return {"rows": compare(records, ev), "command": ev.command, "timings": timings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="oracle,imperfect")
    ap.add_argument("--per-category", type=int, default=None, help="entries per category (default: all)")
    ap.add_argument("--out", default="runs/bfcl-agreement")
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for policy in args.policies.split(","):
        results[policy] = anyio.run(run_policy, policy, args.per_category, out, args.concurrency)
    (out / "agreement.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results))
    policies = list(results)
    print("\nBFCL v4 per-category accuracy, sandgym vs `bfcl evaluate` on the same outputs (bfcl-eval 2026.3.23)")
    head = f"{'category':<26}{'n':>6}" + "".join(f"{p + ' sandgym':>20}{p + ' bfcl':>17}" for p in policies) + f"{'agree':>7}"
    print(head)
    cats = [r["category"] for r in results[policies[0]]["rows"]]
    all_agree = True
    for i, cat in enumerate(cats):
        rows = [results[p]["rows"][i] for p in policies]
        agree = all(r["agree"] for r in rows)
        all_agree &= agree
        print(f"{cat:<26}{rows[0]['n']:>6}" + "".join(f"{r['sandgym']:>20.4f}{r['bfcl']:>17.4f}" for r in rows)
              + f"{'yes' if agree else 'NO':>7}")
    print(f"every category agrees exactly: {'yes' if all_agree else 'NO'}")


if __name__ == "__main__":
    main()
