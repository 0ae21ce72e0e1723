"""Evaluation runs: roll out an environment over its eval rows, append every finished rollout
to `results.jsonl` at once (one write(2) per record, so a killed run loses nothing), resume a
run by skipping the (example_id, rollout_index) pairs already recorded, and summarise
(reward mean, unbiased pass@k, errors, timing)."""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio

from sandgym.errors import UserError

from .clients import ModelClient
from .environment import Environment
from .state import State
from .stats import ks_for, pass_at_k

RESULTS = "results.jsonl"
META = "meta.json"
SUMMARY = "summary.json"


def record_of(state: State) -> dict[str, Any]:
    return state.model_dump(mode="json")


class RecordLog:
    """Append-only JSONL of rollout records. Each line is written whole with one write(2)
    the moment its rollout finishes: from then on it is the kernel's, so a SIGKILLed run
    loses nothing. fsync (against a machine crash) runs at most every `fsync_every_s` and at
    close, not per line: a per-line fsync blocks the event loop. A line cut short (a crash
    mid-write) is dropped, and the file repaired, when the log is reopened."""

    def __init__(self, path: Path, *, fsync_every_s: float = 1.0) -> None:
        self.path = path
        self.fsync_every_s = fsync_every_s
        self._last_sync = time.monotonic()
        self.records: dict[tuple[int, int], dict[str, Any]] = {}
        if path.exists():
            self._load_and_repair()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _load_and_repair(self) -> None:
        good: list[str] = []
        dirty = False
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    dirty = True  # a partial last line from a killed run
                    continue
                try:
                    rec = json.loads(line)
                    key = (int(rec["example_id"]), int(rec["rollout_index"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    dirty = True
                    continue
                if key in self.records:
                    dirty = True
                    continue
                self.records[key] = rec
                good.append(line)
        if dirty:
            tmp = self.path.with_suffix(".jsonl.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(good)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def done(self) -> set[tuple[int, int]]:
        return set(self.records)

    def append(self, record: dict[str, Any]) -> None:
        key = (int(record["example_id"]), int(record["rollout_index"]))
        if key in self.records:
            return
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        os.write(self._fd, line)
        self.records[key] = record
        if time.monotonic() - self._last_sync >= self.fsync_every_s:
            os.fsync(self._fd)
            self._last_sync = time.monotonic()

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)


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


# What makes records comparable: resuming into a folder that holds another policy's or
# another checkpoint's records would silently mix two runs in one summary.
_RUN_IDENTITY = ("env", "model", "sampling_args", "policy", "checkpoint", "env_args")


def _same_run(path: Path, new: Mapping[str, Any]) -> None:
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # no readable meta: records written by an older version; resume as before
    # The new meta as it will be written (default=str), so both sides compare as JSON.
    cur = json.loads(json.dumps(dict(new), default=str))
    for key in _RUN_IDENTITY:
        if key in old and key in cur and old[key] != cur[key]:
            raise UserError(
                f"{path.parent} holds records of another run ({key}: {old[key]!r}, now {cur[key]!r}); "
                "resuming would mix them: choose another output folder or remove that one"
            )


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
    on_start: Callable[[int, int], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume, when `output_dir` holds a results file) an evaluation; returns the
    summary over every record in the file. Group rewards, when the rubric has any, are
    applied once a group's rollouts are all done, so those groups are recorded together."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = RecordLog(out / RESULTS)
    rows = env.rows(num_examples)
    todo = [(row, i) for row in rows for i in range(rollouts_per_example) if (int(row["example_id"]), i) not in log.done()]
    wanted = {(int(row["example_id"]), i) for row in rows for i in range(rollouts_per_example)}
    already = len(wanted & log.done())
    if on_start:
        on_start(len(wanted), already)
    meta_doc = {
        "env": env.name,
        "model": model,
        "num_examples": num_examples,
        "rollouts_per_example": rollouts_per_example,
        "sampling_args": dict(sampling_args or {}),
        **dict(meta or {}),
    }
    if already:
        _same_run(out / META, meta_doc)
    (out / META).write_text(json.dumps(meta_doc, indent=2, default=str))
    grouped = bool(env.rubric.group_funcs)
    limit = anyio.CapacityLimiter(max(1, concurrency))
    t0 = time.perf_counter()

    def emit(state: State) -> None:
        rec = record_of(state)
        log.append(rec)
        if on_record:
            on_record(rec)

    started = 0
    pool: dict[str, Any] = {"mgr": None, "target": 0}  # the session's manager, its warm target

    async def shrink_pool() -> None:
        # Near the end, stop the warm pool from making sandboxes no rollout will use.
        unstarted = len(todo) - started
        mgr = pool["mgr"]
        if mgr is not None and unstarted < pool["target"]:
            pool["target"] = unstarted
            for spec in {s.key(): s for s in env.sandbox_specs()}.values():
                await mgr.warm(spec, unstarted)

    async def one(row: Mapping[str, Any], i: int, sink: list[State] | None) -> None:
        nonlocal started
        async with limit:
            started += 1
            await shrink_pool()
            state = await env.rollout(client, model, row, i, sampling_args)
        if sink is None:
            emit(state)
        else:
            sink.append(state)

    async def group(row: Mapping[str, Any], indices: list[int]) -> None:
        states: list[State] = []
        async with anyio.create_task_group() as tg:
            for i in indices:
                tg.start_soon(one, row, i, states)
        await env.score_group(states)
        for s in sorted(states, key=lambda s: s.rollout_index):
            emit(s)

    n_sb = max_sandboxes or max(1, concurrency)
    try:
        n_warm = min(n_sb, len(todo)) if warm else 0
        async with env.sandbox_session(provider, max_sandboxes=n_sb, warm=n_warm) as mgr:
            pool.update(mgr=mgr, target=n_warm if warm else 0)
            async with anyio.create_task_group() as tg:
                if grouped:
                    pending: dict[int, tuple[Mapping[str, Any], list[int]]] = {}
                    for row, i in todo:
                        pending.setdefault(int(row["example_id"]), (row, []))[1].append(i)
                    for first, indices in pending.values():
                        tg.start_soon(group, first, indices)
                else:
                    for row, i in todo:
                        tg.start_soon(one, row, i, None)
    finally:
        log.close()
    wall = time.perf_counter() - t0
    records = [r for k, r in log.records.items() if k in wanted]
    summary = {
        "env": env.name,
        "model": model,
        "rollouts_per_example": rollouts_per_example,
        **summarize(records, pass_threshold=env.pass_threshold),
        "new_rollouts": len(todo),
        "resumed_rollouts": already,
        "wall_s": wall,
        "rollouts_per_s": (len(todo) / wall) if wall > 0 else None,
        "output_dir": str(out),
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, default=str))
    return summary
