"""Evaluation runs: roll out an environment over its eval rows, record every finished rollout
in the run folder at once (sandgym.run_folder: meta.json, results.jsonl, summary.json; a
killed run loses nothing), resume a run by skipping the (example_id, rollout_index) pairs
already recorded, and summarise (reward mean, unbiased pass@k, infrastructure failures,
timing). `run_eval` runs on this machine; sandgym.fleet.driver runs the same plan on a
Ray fleet with the same folder, rule and summary."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio

from sandgym.run_folder import RunFolder

from .clients import ModelClient
from .environment import Environment
from .state import State
from .stats import ks_for, pass_at_k

# What makes two evals' records comparable: resuming into a folder that holds another
# policy's or another checkpoint's records would silently mix two runs in one summary.
EVAL_IDENTITY = ("env", "model", "sampling_args", "policy", "checkpoint", "env_args")


def record_of(state: State) -> dict[str, Any]:
    return state.model_dump(mode="json")


def eval_folder(output_dir: str | os.PathLike[str]) -> RunFolder:
    """An eval's run folder (records keyed by example id and rollout index)."""
    return RunFolder(output_dir, kind="eval", identity=EVAL_IDENTITY)


def eval_meta(env: Environment, model: str, num_examples: int | None, rollouts_per_example: int,
              sampling_args: Mapping[str, Any] | None, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        "env": env.name,
        "model": model,
        "num_examples": num_examples,
        "rollouts_per_example": rollouts_per_example,
        "sampling_args": dict(sampling_args or {}),
        **dict(extra or {}),
    }


Row = Mapping[str, Any]
Key = tuple[int, int]


class EvalPlan:
    """What an eval run is to do: every (row, rollout index) wanted, and the ones the folder
    has no record of yet; with group rewards, a row's missing rollouts go together."""

    def __init__(self, rows: Sequence[Row], rollouts_per_example: int, done: set[Any]) -> None:
        self.wanted: list[Key] = [(int(row["example_id"]), i) for row in rows for i in range(rollouts_per_example)]
        self.todo: list[tuple[Row, int]] = [
            (row, i) for row in rows for i in range(rollouts_per_example) if (int(row["example_id"]), i) not in done
        ]
        self.resumed = len(self.wanted) - len(self.todo)

    def groups(self) -> list[tuple[Row, list[int]]]:
        pending: dict[int, tuple[Row, list[int]]] = {}
        for row, i in self.todo:
            pending.setdefault(int(row["example_id"]), (row, []))[1].append(i)
        return list(pending.values())


def infra_failure_note(summary: Mapping[str, Any], max_rate: float) -> str | None:
    """One line when the share of rollouts that failed for infrastructure reasons passes
    `max_rate` (the summary's reward is then the mean of a subset the failures chose), else None."""
    rate = float(summary.get("infra_failure_rate") or 0.0)
    if rate <= max_rate:
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted((summary.get("error_kinds") or {}).items()))
    return (f"{summary['errors']}/{summary['num_rollouts']} rollouts ({rate:.0%}) failed for infrastructure reasons"
            f" ({kinds}), more than --max-infra-failure-rate {max_rate:g}: the reward is not a measurement of the policy;"
            f" see the `error` of each record in {os.path.join(str(summary.get('output_dir', '.')), 'results.jsonl')}")


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def _error_kind(record: Mapping[str, Any]) -> str:
    # Records written before errors were typed carry only the message: use its prefix.
    return str(record.get("error_kind") or str(record["error"]).split(":", 1)[0])


def summarize(records: Iterable[Mapping[str, Any]], *, pass_threshold: float = 1.0) -> dict[str, Any]:
    """Aggregate records. A rollout with an `error` failed for reasons that are not the
    policy's (sandbox, model server, environment code, time limit, reward function): it is
    counted in `infra_failure_rate` and left out of `reward_mean` and pass@k, which are over
    valid attempts; `reward_mean_with_failures` counts failures as 0 (what naive tools report)."""
    recs = list(records)
    rewards = [float(r.get("reward") or 0.0) for r in recs]
    valid = [(r, rew) for r, rew in zip(recs, rewards, strict=True) if not r.get("error")]
    valid_rewards = [rew for _, rew in valid]
    by_example: dict[int, list[float]] = defaultdict(list)
    for r, rew in valid:
        by_example[int(r["example_id"])].append(rew)
    examples = {int(r["example_id"]) for r in recs}
    passk: dict[str, float] = {}
    if by_example:
        n_min = min(len(v) for v in by_example.values())
        for k in ks_for(n_min):
            vals = [pass_at_k(len(v), sum(1 for x in v if x >= pass_threshold - 1e-9), k) for v in by_example.values()]
            passk[str(k)] = sum(vals) / len(vals)
    errors = [r for r in recs if r.get("error")]
    timing_keys = ("setup_s", "model_s", "tools_s", "scoring_s", "total_s")
    timing = {f"{k}_mean": _mean(float((r.get("timing") or {}).get(k) or 0.0) for r in recs) for k in timing_keys}
    metric_names = sorted({m for r in recs for m in (r.get("metrics") or {})})
    metrics = {m: _mean(float(r["metrics"][m]) for r in recs if m in (r.get("metrics") or {})) for m in metric_names}
    mean_valid = _mean(valid_rewards)
    std = math.sqrt(sum((x - (mean_valid or 0.0)) ** 2 for x in valid_rewards) / len(valid_rewards)) if valid_rewards else None
    error_kinds: dict[str, int] = defaultdict(int)
    for r in errors:
        error_kinds[_error_kind(r)] += 1
    return {
        "num_examples": len(examples),
        "num_rollouts": len(recs),
        "reward_mean": mean_valid,
        "reward_std": std,
        "reward_mean_with_failures": _mean(rewards),
        "passed": sum(1 for x in valid_rewards if x >= pass_threshold - 1e-9),
        "pass_at_k": passk,
        "pass_at_k_examples": len(by_example),  # examples with at least one valid attempt
        "errors": len(errors),
        "error_kinds": dict(error_kinds),
        "infra_failure_rate": len(errors) / len(recs) if recs else 0.0,
        "timing": timing,
        "metrics": metrics,
        "usage": {
            "prompt_tokens": sum(int((r.get("usage") or {}).get("prompt_tokens", 0)) for r in recs),
            "completion_tokens": sum(int((r.get("usage") or {}).get("completion_tokens", 0)) for r in recs),
        },
    }


def eval_summary(env: Environment, model: str, rollouts_per_example: int, folder: RunFolder, plan: EvalPlan,
                 wall_s: float) -> dict[str, Any]:
    """The run's summary over every wanted record in the folder (resumed ones included)."""
    records = folder.records_of(plan.wanted)
    return {
        "env": env.name,
        "model": model,
        "rollouts_per_example": rollouts_per_example,
        **summarize(records, pass_threshold=env.pass_threshold),
        "new_rollouts": len(plan.todo),
        "resumed_rollouts": plan.resumed,
        "wall_s": wall_s,
        "rollouts_per_s": (len(plan.todo) / wall_s) if wall_s > 0 else None,
        "output_dir": str(folder.root),
    }


async def run_eval(
    env: Environment,
    client: ModelClient,
    model: str,
    *,
    output_dir: str | os.PathLike[str],
    num_examples: int | None = None,
    rollouts_per_example: int = 1,
    concurrency: int = 4,
    sampling_args: Mapping[str, Any] | None = None,
    provider: Any = "docker",
    max_sandboxes: int | None = None,
    warm: bool = True,
    meta: Mapping[str, Any] | None = None,
    resume: bool | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run an evaluation into the run folder `output_dir`, or resume the run it holds;
    returns the summary over every record in the folder. `resume`: True, the folder must
    hold this run; False, it must hold none; None, either (RunFolder's rules; another run's
    folder is refused). Group rewards, when the rubric has any, are applied once a group's
    rollouts are all done, so those groups are recorded together."""
    folder = eval_folder(output_dir)
    folder.open(eval_meta(env, model, num_examples, rollouts_per_example, sampling_args, meta), resume=resume)
    try:
        plan = EvalPlan(env.rows(num_examples), rollouts_per_example, folder.done())
        if on_start:
            on_start(len(plan.wanted), plan.resumed)
        wall = await _roll_out(env, client, model, plan, folder, concurrency=concurrency, sampling_args=sampling_args,
                               provider=provider, max_sandboxes=max_sandboxes, warm=warm, on_record=on_record)
    finally:
        folder.close()
    summary = eval_summary(env, model, rollouts_per_example, folder, plan, wall)
    folder.write_summary(summary)
    return summary


async def _roll_out(
    env: Environment, client: ModelClient, model: str, plan: EvalPlan, folder: RunFolder, *, concurrency: int,
    sampling_args: Mapping[str, Any] | None, provider: Any, max_sandboxes: int | None, warm: bool,
    on_record: Callable[[dict[str, Any]], None] | None,
) -> float:
    """Run the plan's rollouts on this machine, recording each as it finishes; the wall time."""
    todo = plan.todo
    limit = anyio.CapacityLimiter(max(1, concurrency))
    t0 = time.perf_counter()

    def emit(state: State) -> None:
        rec = record_of(state)
        folder.append(rec)
        if on_record:
            on_record(rec)

    finished = 0
    pool: dict[str, Any] = {"mgr": None, "target": 0}  # the session's manager, its warm target

    async def shrink_pool() -> None:
        # Near the end, stop the warm pool from making sandboxes no rollout will use: keep no
        # more than rollouts left to finish. (Counting rollouts not yet started instead let
        # the pool destroy sandboxes that started rollouts were about to score in, and make
        # new ones for them: HumanEval's last 3 of 164 waited 0.75 s for fresh containers.)
        left = len(todo) - finished
        mgr = pool["mgr"]
        if mgr is not None and left < pool["target"]:
            pool["target"] = left
            for spec in {s.key(): s for s in env.sandbox_specs()}.values():
                await mgr.warm(spec, left, wait=False)  # lowers the target; a rollout never waits on a fill

    async def one(row: Row, i: int, sink: list[State] | None) -> None:
        nonlocal finished
        async with limit:
            state = await env.rollout(client, model, row, i, sampling_args)
            finished += 1
            await shrink_pool()
        if sink is None:
            emit(state)
        else:
            sink.append(state)

    async def group(row: Row, indices: list[int]) -> None:
        states: list[State] = []
        async with anyio.create_task_group() as tg:
            for i in indices:
                tg.start_soon(one, row, i, states)
        await env.score_group(states)
        for s in sorted(states, key=lambda s: s.rollout_index):
            emit(s)

    n_sb = max_sandboxes or max(1, concurrency)
    n_warm = min(n_sb, len(todo)) if warm else 0
    async with env.sandbox_session(provider, max_sandboxes=n_sb, warm=n_warm) as mgr:
        pool.update(mgr=mgr, target=n_warm)
        async with anyio.create_task_group() as tg:
            if env.rubric.group_funcs:
                for row, indices in plan.groups():
                    tg.start_soon(group, row, indices)
            else:
                for row, i in todo:
                    tg.start_soon(one, row, i, None)
    return time.perf_counter() - t0
