"""What a run folder holds, read for the viewer. The names and the reading rules are the
writers' own, imported: sandgym.run_folder (meta.json, results.jsonl, summary.json of eval,
Ray eval and SWE runs: `read_meta`, `read_records`, `read_summary`), sandgym.swe.store (a SWE
run's instance folders and kinds) and sandgym.train.folder (a training run's files). This
module knows only what the viewer makes of them:

    eval / BFCL       a meta whose kind is not a SWE kind ("eval"; older evals: none), a
                      rollout record a line, the summary at the end (before it: computed
                      from the records); BFCL: an env named bfcl_*
    SWE debug/validate  a meta of kind debug or validate, an
                      instance a line (keyed; the last line of a key wins: an instance run
                      again supersedes its line), <instance>/result.json, *.log, applied.diff,
                      the summary at the end
    train (GRPO)      config.json, metrics.jsonl (a line per step), samples.jsonl
    SFT               the same with a `data` section in config.json, and no samples

A folder is a run when it holds a meta, a results file or a metrics file; `Registry` walks
the folders it is given for them. Each kind is a `Run` (one protocol, several implementations).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from sandgym.core.evaluation import summarize
from sandgym.core.sandbox_env import exec_flags
from sandgym.run_folder import RESULTS, SUMMARY, read_meta, read_records, read_summary, unit_key
from sandgym.swe.store import DIFF, LOG_SUFFIX, RESULT, VALIDATE, safe_name
from sandgym.swe.store import KINDS as SWE_KINDS
from sandgym.train.folder import CONFIG, METRICS, SAMPLES

from .index import JsonlIndex
from .paths import confine

LIVE_WINDOW_S = 120.0  # a run without its closing summary, written to this recently, is running
STRING_LIMIT = 64 << 10  # longer strings of a record come truncated (the rest on request)
LIST_LIMIT = 20_000  # longer lists (token ids, logprobs) too
ERROR_CHARS = 300
WALK_DEPTH = 4
FIRST_WAIT_S = 0.25  # how long a request waits for indexing before answering with what is there
HEAD_LINES = 200  # read directly while a file's index is not there yet
BIG_RUN = 20_000  # records past which a growing run's live summary is recomputed at most...
LIVE_SUMMARY_EVERY_S = 5.0  # ...this often


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _status(folder: Path) -> str:
    """A run folder's: finished (its summary is there and newer than its records), running
    (records written in the last minutes) or stopped."""
    last = _mtime(folder / RESULTS)
    done = _mtime(folder / SUMMARY)
    if done is not None and (last is None or done >= last - 1.0):
        return "finished"
    if last is not None and time.time() - last < LIVE_WINDOW_S:
        return "running"
    return "stopped"


# ---- one rollout record, as columns for the table ----------------------------------------

_HEAD = re.compile(rb'^\{"id": "[^"\\]*", "env": "[^"\\]*", "example_id": (-?\d+), "rollout_index": (-?\d+),')
_TAIL = b'], "reward": '
_FINISH = re.compile(rb'"finish_reason": (?:"([^"\\]*)"|null)')


def _first_line(text: Any) -> str | None:
    if text is None:
        return None
    s = str(text)
    return s.split("\n", 1)[0][:ERROR_CHARS]


def _columns(rec: dict[str, Any], turns: int, truncated: bool, size: int) -> dict[str, Any]:
    err = rec.get("error")
    kind = rec.get("error_kind") or (str(err).split(":", 1)[0] if err else None)
    return {
        "example_id": int(rec.get("example_id") or 0),
        "rollout_index": int(rec.get("rollout_index") or 0),
        "reward": float(rec.get("reward") or 0.0),
        "error": _first_line(err),
        "error_kind": kind,
        "stop_reason": rec.get("stop_reason"),
        "metrics": rec.get("metrics") or {},
        # Of the timings only the total (the table's column; the means are summary.json's).
        "timing": {"total_s": (rec.get("timing") or {}).get("total_s")},
        "usage": rec.get("usage") or {},
        "task": rec.get("task"),
        "turns": turns,
        "truncated": truncated,
        "bytes": size,
        **({"step": rec["step"]} if "step" in rec else {}),
    }


def rollout_columns(line: bytes) -> dict[str, Any]:
    """The table's columns of one record without parsing its turns: the head (ids) by a
    pattern, the tail (reward onwards: small) as JSON. A record written as State's JSON
    has them in that order; any other line is parsed whole."""
    head = _HEAD.match(line[:512])
    cut = line.rfind(_TAIL)
    if head and cut > 0:
        try:
            tail = json.loads(b"{" + line[cut + 3:])
        except ValueError:
            tail = None
        if isinstance(tail, dict) and "reward" in tail:
            tail["example_id"], tail["rollout_index"] = int(head.group(1)), int(head.group(2))
            # One key of each turn (a string cannot hold an unescaped quote, so this is a key).
            finishes = _FINISH.findall(line, 0, cut)
            return _columns(tail, len(finishes), tail.get("stop_reason") == "truncated" or b"length" in finishes, len(line))
    rec = json.loads(line)
    turns_list = rec.get("turns") or []
    truncated = rec.get("stop_reason") == "truncated" or any(t.get("finish_reason") == "length" for t in turns_list)
    return _columns(rec, len(turns_list), truncated, len(line))


def bfcl_columns(line: bytes) -> dict[str, Any]:
    """BFCL records are small: parsed whole, with the entry's category and id."""
    rec = json.loads(line)
    turns_list = rec.get("turns") or []
    cols = _columns(rec, len(turns_list), any(t.get("finish_reason") == "length" for t in turns_list), len(line))
    info = rec.get("info") or {}
    cols.update(category=info.get("category"), entry=info.get("id"), checker=info.get("bfcl_error_type"))
    return cols


def json_row(line: bytes) -> dict[str, Any]:
    doc = json.loads(line)
    return doc if isinstance(doc, dict) else {"value": doc}


# ---- a record, for the trajectory page ---------------------------------------------------


def path_key(path: list[Any]) -> str:
    """A place in a record as the browser names it too: JSON.stringify of the key list."""
    return json.dumps(path, separators=(",", ":"), ensure_ascii=False)


def _clip(value: Any, path: list[Any], cut: dict[str, int]) -> Any:
    """`value` with long strings and lists cut, each cut noted in `cut` by its path."""
    if isinstance(value, str):
        if len(value) > STRING_LIMIT:
            cut[path_key(path)] = len(value)
            return value[:STRING_LIMIT]
        return value
    if isinstance(value, list):
        if len(value) > LIST_LIMIT:
            cut[path_key(path)] = len(value)
            value = value[:LIST_LIMIT]
        return [_clip(v, path + [i], cut) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _clip(v, path + [k], cut) for k, v in value.items()}
    return value


def record_view(rec: dict[str, Any]) -> dict[str, Any]:
    """A record for the browser: each turn's prompt after the first is the conversation so
    far again (dropped: its length is kept), as are the prompt token ids; long strings and
    lists are cut (`truncated`: path -> full length; `/text` has the rest); tool results
    carry the flags their text states (exit code, timed out, truncated, stderr)."""
    turns = rec.get("turns") or []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            continue
        t["prompt_messages"] = len(t.get("prompt") or [])
        if i > 0:
            t["prompt"] = []
        tok = t.get("tokens")
        if isinstance(tok, dict):
            tok["prompt_len"] = len(tok.get("prompt_ids") or [])
            tok["prompt_ids"] = []
    cut: dict[str, int] = {}
    view = _clip(rec, [], cut)
    for t in view.get("turns") or []:
        for m in (t.get("env_response") or []) if isinstance(t, dict) else []:
            if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("content"), str):
                m["flags"] = exec_flags(m["content"])
    view["truncated"] = cut
    return view


def text_at(rec: Any, path: list[Any], start: int, length: int) -> dict[str, Any]:
    """A slice of the string (or list) at `path` in a record: what a cut left out."""
    node = rec
    for key in path:
        if isinstance(node, list) and isinstance(key, int) and not isinstance(key, bool) and -len(node) <= key < len(node):
            node = node[key]
        elif isinstance(node, dict) and isinstance(key, str) and key in node:
            node = node[key]
        else:
            raise KeyError(path_key(path))
    if not isinstance(node, (str, list)):
        raise KeyError(path_key(path))
    start = max(0, start)
    return {"path": path, "start": start, "total": len(node), "value": node[start:start + max(0, length)]}


# ---- the query of the rollouts table -----------------------------------------------------

SORTABLE = ("n", "example_id", "rollout_index", "reward", "error_kind", "turns", "truncated", "bytes", "step", "category")


def query(rows: list[dict[str, Any]], *, offset: int = 0, limit: int = 50, sort: str = "n", desc: bool = False,
          error_kind: str | None = None, example_id: int | None = None, truncated: bool | None = None,
          min_reward: float | None = None, max_reward: float | None = None, step: int | None = None,
          category: str | None = None, min_turns: int | None = None) -> dict[str, Any]:
    """Filter, sort and page the indexed rows (`n`: the line number in the file).
    error_kind "none" keeps the valid rollouts, "any" the failed ones."""
    if sort not in SORTABLE:
        raise ValueError(f"cannot sort by {sort!r}; one of {', '.join(SORTABLE)}")
    picked = []
    for n, r in enumerate(rows):
        if error_kind is not None:
            k = r.get("error_kind")
            if (error_kind == "none" and k) or (error_kind == "any" and not k) or (error_kind not in ("none", "any") and k != error_kind):
                continue
        if example_id is not None and r.get("example_id") != example_id:
            continue
        if truncated is not None and bool(r.get("truncated")) != truncated:
            continue
        if min_reward is not None and float(r.get("reward") or 0.0) < min_reward:
            continue
        if max_reward is not None and float(r.get("reward") or 0.0) > max_reward:
            continue
        if step is not None and r.get("step") != step:
            continue
        if min_turns is not None and int(r.get("turns") or 0) < min_turns:
            continue
        if category is not None and r.get("category") != category:
            continue
        picked.append(n)
    if sort != "n":
        def key(n: int) -> tuple[bool, Any]:
            v = rows[n].get(sort)
            return (True, 0) if v is None else (False, v.lower() if isinstance(v, str) else v)
        picked.sort(key=key, reverse=desc)
    elif desc:
        picked.reverse()
    page = picked[max(0, offset):max(0, offset) + max(0, limit)]
    kinds: dict[str, int] = defaultdict(int)
    for r in rows:
        kinds[r.get("error_kind") or "none"] += 1
    return {"total": len(rows), "matched": len(picked), "offset": offset,
            "rows": [{"n": n, **{k: v for k, v in rows[n].items() if k not in ("metrics", "timing", "usage")},
                      "total_s": (rows[n].get("timing") or {}).get("total_s"),
                      "completion_tokens": (rows[n].get("usage") or {}).get("completion_tokens")} for n in page],
            "error_kinds": dict(kinds)}


# ---- runs --------------------------------------------------------------------------------


class Run(Protocol):
    id: str
    path: Path
    shown: str  # the path as the user named it (the root as given on the command line)
    kind: str
    records: RecordsFile | None  # rollout records (the rollouts table), when the run has them

    def card(self) -> dict[str, Any]:
        """One row of the runs list."""

    def detail(self) -> dict[str, Any]:
        """Everything the run's page shows first."""


class RecordsFile:
    """A JSONL file of rollout records with its index: the rollouts table and trajectories.
    Until the index has its first rows (a saved one loading, a big file's first chunk), the
    first HEAD_LINES lines are read directly, so a page is there at once."""

    def __init__(self, path: Path, extractor: Any, name: str) -> None:
        self.index = JsonlIndex(path, extractor, name=name)
        self._head: list[tuple[int, int, bytes]] = []

    def rows(self) -> list[dict[str, Any]]:
        self.index.refresh(FIRST_WAIT_S)
        rows, n = self.index.snapshot()
        if n == 0 and self.index.building:
            self._head = self.index.head(HEAD_LINES)
            return [self.index.extract(line) for _, _, line in self._head]
        return rows

    def raw_span(self, n: int) -> tuple[Path, int, int]:
        if 0 <= n < len(self.index):
            start, end = self.index.span(n)
        elif 0 <= n < len(self._head) and not len(self.index):
            start, end, _ = self._head[n]
        else:
            raise KeyError(n)
        return self.index.path, start, end

    def record(self, n: int) -> dict[str, Any]:
        path, start, end = self.raw_span(n)
        with open(path, "rb") as f:
            f.seek(start)
            return json.loads(f.read(end - start))


class EvalRun:
    """`sandgym eval`: meta.json, results.jsonl, summary.json."""

    kind = "eval"
    extractor_name = "rollout-v1"

    def __init__(self, run_id: str, path: Path) -> None:
        self.id, self.path, self.shown = run_id, path, str(path)
        self.records = RecordsFile(path / RESULTS, self._extractor(), self.extractor_name)
        self._live: tuple[int, float, dict[str, Any]] | None = None  # (records, when, summary)

    @staticmethod
    def _extractor() -> Any:
        return rollout_columns

    def meta(self) -> dict[str, Any]:
        return read_meta(self.path) or {}

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The run's summary when it covers every record; else computed from the index (a
        live or killed run): again when records were added, but for a big run at most every
        LIVE_SUMMARY_EVERY_S while it grows (the count itself is always current)."""
        saved = read_summary(self.path)
        if saved is not None and saved.get("num_rollouts") == len(rows):
            return {**saved, "source": SUMMARY}
        now, last = time.monotonic(), self._live
        if last is not None and (last[0] == len(rows) or (len(rows) > BIG_RUN and now - last[1] < LIVE_SUMMARY_EVERY_S)):
            return last[2]
        live = {**summarize([r for r in rows if not r.get("bad")]), "source": "live"}
        self._live = (len(rows), now, live)
        return live

    def card(self) -> dict[str, Any]:
        rows = self.records.rows()
        meta, s = self.meta(), self.summary(rows)
        return {
            "id": self.id, "kind": self.kind, "path": self.shown, "env": meta.get("env") or s.get("env"),
            "model": meta.get("policy") or meta.get("model"), "status": self.status(),
            "reward_mean": s.get("reward_mean"), "pass_at_k": s.get("pass_at_k") or {},
            "rollouts": len(rows), "examples": s.get("num_examples"), "errors": s.get("errors"),
            "error_kinds": s.get("error_kinds") or {}, "wall_s": s.get("wall_s"),
            "indexing": self.records.index.progress(),
        }

    def status(self) -> str:
        return _status(self.path)

    def detail(self) -> dict[str, Any]:
        rows = self.records.rows()
        return {**self.card(), "meta": self.meta(), "summary": self.summary(rows)}


class BFCLRun(EvalRun):
    """An eval of a bfcl_v4_* environment: also the per-category table, and per entry the
    calls made against BFCL's possible answers with the checker's reason."""

    kind = "bfcl"
    extractor_name = "bfcl-v1"

    @staticmethod
    def _extractor() -> Any:
        return bfcl_columns

    def detail(self) -> dict[str, Any]:
        rows = self.records.rows()
        cats: dict[str, dict[str, Any]] = {}
        for r in rows:
            c = cats.setdefault(r.get("category") or "?", {"category": r.get("category") or "?", "entries": 0, "correct": 0, "errors": 0})
            c["entries"] += 1
            c["correct"] += 1 if float(r.get("reward") or 0.0) >= 1.0 else 0
            c["errors"] += 1 if r.get("error") else 0
        table = [{**c, "accuracy": c["correct"] / c["entries"] if c["entries"] else None} for _, c in sorted(cats.items())]
        return {**super().detail(), "categories": table}

    @staticmethod
    def entry(rec: dict[str, Any]) -> dict[str, Any]:
        info = rec.get("info") or {}
        out = {"id": info.get("id"), "category": info.get("category"), "valid": info.get("bfcl_valid"),
               "calls": info.get("bfcl_result"), "error_type": info.get("bfcl_error_type"), "reason": info.get("bfcl_error"),
               "force_quit": info.get("bfcl_force_quit")}
        try:
            out["possible_answers"] = possible_answers(str(info.get("category")), str(info.get("id")))
        except Exception as exc:  # bfcl-eval missing on this host, or an unknown entry
            out["possible_answers_error"] = f"{type(exc).__name__}: {exc}"
        return out


@lru_cache(maxsize=64)
def _bfcl_truth(category: str) -> dict[str, Any]:
    from sandgym.bfcl.data import load_entries

    return {e.id: e.ground_truth for e in load_entries(category)}


def possible_answers(category: str, entry_id: str) -> Any:
    return _bfcl_truth(category)[entry_id]


class SWERun:
    """`sandgym swe debug` / `validate` (meta.json's kind says which): an instance a line of
    results.jsonl, an instance folder per key."""

    kind = "swe"
    records = None

    def __init__(self, run_id: str, path: Path) -> None:
        self.id, self.path, self.shown = run_id, path, str(path)
        self._lines: tuple[tuple[int, int, int], list[dict[str, Any]]] | None = None  # (the file's stat, its lines)

    def meta(self) -> dict[str, Any]:
        return read_meta(self.path) or {}

    def validating(self) -> bool:
        return self.meta().get("kind") == VALIDATE

    def lines(self) -> list[dict[str, Any]]:
        """The instances' lines as a resume reads them (run_folder.read_records: a torn line
        left out, the last line of a key wins), read again when the file changed. A line is
        small (no logs, no diff, no per-test table), so the file is read whole."""
        path = self.path / RESULTS
        try:
            st = path.stat()
        except OSError:
            return []
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._lines
        if cached is None or cached[0] != seen:
            records, _, _ = read_records(path, unit_key)
            cached = self._lines = (seen, list(records.values()))
        return cached[1]

    def status(self) -> str:
        return _status(self.path)

    def card(self) -> dict[str, Any]:
        meta, lines = self.meta(), self.lines()
        statuses: dict[str, int] = defaultdict(int)
        infra: dict[str, int] = defaultdict(int)
        for r in lines:
            statuses[str(r.get("status"))] += 1
            if r.get("status") == "infra":
                infra[str(r.get("infra_reason") or "infra")] += 1
        closing = read_summary(self.path) or {}
        return {
            "id": self.id, "kind": self.kind, "mode": meta.get("kind"), "path": self.shown,
            "env": f"swe {meta.get('kind', '?')} ({meta.get('step', '?')})", "model": meta.get("tasks"),
            "status": self.status(), "instances": len({r.get("instance_id") for r in lines}), "runs": len(lines),
            "resolved": statuses.get("resolved", 0), "reward_mean": statuses.get("resolved", 0) / len(lines) if lines else None,
            "statuses": dict(statuses), "error_kinds": dict(infra), "wall_s": closing.get("wall_s"),
            "valid": closing.get("valid") if meta.get("kind") == VALIDATE else None,
        }

    def detail(self) -> dict[str, Any]:
        lines = self.lines()
        out = {**self.card(), "meta": self.meta(), "lines": lines}
        if self.validating():
            out["validation"] = self.validation(lines)
        return out

    def validation(self, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Per instance: the verdict (the summary's, when written) and the listed tests whose
        outcome changed between runs of the same step (flaky), from the lines so far."""
        saved = {v["instance_id"]: v for v in (read_summary(self.path) or {}).get("instances", []) if isinstance(v, dict) and "instance_id" in v}
        by_inst: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in lines:
            by_inst[str(r.get("instance_id"))].append(r)
        out = []
        for iid, runs in by_inst.items():
            out.append({"instance_id": iid, "runs": [r.get("key") for r in runs], "flaky": sorted(flaky_tests(runs)),
                        **{k: saved[iid].get(k) for k in ("verdict", "problems", "gold_resolved", "empty_resolved", "flaky_other")
                           if iid in saved}})
        return out

    def instance(self, key: str) -> dict[str, Any]:
        """An instance (a key of results.jsonl): result.json, its logs and diff by name."""
        if key not in {str(r["key"]) for r in self.lines()}:
            raise KeyError(key)
        rel = safe_name(key)
        folder = self.path / rel
        result = _read_json(folder / RESULT) or {}
        result.pop("applied_diff", None)  # the file of its own, fetched in slices
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and (p.suffix == LOG_SUFFIX or p.name == DIFF)) if folder.is_dir() else []
        out: dict[str, Any] = {"key": key, "dir": rel, "result": result,
                               "files": [{"name": n, "path": f"{rel}/{n}", "bytes": (folder / n).stat().st_size} for n in files]}
        if self.validating():
            iid = result.get("instance_id") or key.split("/")[0]
            sibling = [r for r in self.lines() if r.get("instance_id") == iid]
            out["flaky"] = sorted(flaky_tests(sibling))
            out["siblings"] = [{"key": r.get("key"), "step": r.get("step"), "status": r.get("status"),
                                "fail_to_pass": r.get("fail_to_pass") or {}, "pass_to_pass": r.get("pass_to_pass") or {}}
                               for r in sibling]
        return out

    def file(self, rel: str, start: int, length: int) -> dict[str, Any]:
        path = confine(self.path, rel)
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, start))
            data = f.read(max(0, length))
        return {"path": rel, "start": start, "total": size, "value": data.decode("utf-8", errors="replace")}


def flaky_tests(runs: list[dict[str, Any]]) -> set[str]:
    """FAIL_TO_PASS / PASS_TO_PASS tests whose outcome differs between graded runs of the same
    step (validation runs)."""
    by_step: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in runs:
        if r.get("status") in ("resolved", "unresolved"):
            by_step[str(r.get("step"))].append({**(r.get("fail_to_pass") or {}), **(r.get("pass_to_pass") or {})})
    flaky: set[str] = set()
    for outcomes in by_step.values():
        if len(outcomes) < 2:
            continue
        for t in set().union(*outcomes):
            if len({o.get(t, "missing") for o in outcomes}) > 1:
                flaky.add(t)
    return flaky


class TrainRun:
    """`sandgym train` (GRPO) or `sandgym sft`: metrics.jsonl a line per step, config.json,
    and for GRPO samples.jsonl (rollouts of each step)."""

    kind = "train"
    extractor_name = "rollout-v1"

    def __init__(self, run_id: str, path: Path) -> None:
        self.id, self.path, self.shown = run_id, path, str(path)
        self.metrics = JsonlIndex(path / METRICS, json_row, name="metrics-v1")
        self.records = RecordsFile(path / SAMPLES, rollout_columns, self.extractor_name)

    def config(self) -> dict[str, Any]:
        return _read_json(self.path / CONFIG) or {}

    def steps(self) -> list[dict[str, Any]]:
        self.metrics.refresh(FIRST_WAIT_S)
        rows, _ = self.metrics.snapshot()
        return [r for r in rows if "bad" not in r]

    def mode(self, cfg: dict[str, Any], steps: list[dict[str, Any]]) -> str:
        if "data" in cfg or (steps and "reward_mean" not in steps[0]):
            return "sft"
        return "grpo"

    def status(self, cfg: dict[str, Any], steps: list[dict[str, Any]]) -> str:
        total = (cfg.get("optim") or {}).get("steps")
        if total is not None and steps and int(steps[-1].get("step", 0)) >= int(total):
            return "finished"
        m = _mtime(self.path / METRICS)
        return "running" if m is not None and time.time() - m < LIVE_WINDOW_S else "stopped"

    def card(self) -> dict[str, Any]:
        cfg, steps = self.config(), self.steps()
        env = cfg.get("env") or {}
        last = steps[-1] if steps else {}
        fails: dict[str, int] = defaultdict(int)
        for s in steps:
            for k, v in s.items():
                if k.startswith("failed_") and v:
                    fails[k.removeprefix("failed_")] += int(v)
        return {
            "id": self.id, "kind": self.kind, "mode": self.mode(cfg, steps), "path": self.shown,
            "env": ":".join(str(x) for x in (env.get("kind"), env.get("name")) if x) or None,
            "model": (cfg.get("model") or {}).get("name_or_path"), "status": self.status(cfg, steps),
            "steps": len(steps), "total_steps": (cfg.get("optim") or {}).get("steps"),
            "reward_mean": last.get("reward_mean"), "loss": last.get("loss"), "error_kinds": dict(fails),
            "wall_s": sum(float(s.get("step_s") or s.get("train_s") or 0.0) for s in steps) or None,
        }

    def detail(self) -> dict[str, Any]:
        return {**self.card(), "config": self.config(), "samples": len(self.records.rows())}

    def metrics_since(self, since: int) -> dict[str, Any]:
        steps = self.steps()
        return {"since": since, "steps": steps[max(0, since):], "count": len(steps)}


def kind_of(path: Path) -> type[EvalRun] | type[SWERun] | type[TrainRun] | None:
    """Which run a folder holds: by its meta's kind (SWE debug or validate, else an eval),
    else by its files; None when it is not a run folder."""
    meta = read_meta(path)
    if meta is not None and meta.get("kind") in SWE_KINDS:
        return SWERun
    if meta is not None or (path / RESULTS).is_file():
        env = str((meta or {}).get("env") or "")
        return BFCLRun if env.startswith("bfcl_") else EvalRun
    if (path / METRICS).is_file():
        return TrainRun
    return None


class Registry:
    """The runs under the folders given on the command line, found again on each listing
    (a new run appears) and kept by id (their indexes stay warm). An id is the root's
    number and the run's path below it: requests name runs, never paths."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = [r.resolve() for r in roots]
        self.names = [str(r) for r in roots]  # as given: what the pages show
        self.runs: dict[str, Run] = {}

    def scan(self) -> list[Run]:
        found: dict[str, Run] = {}
        for i, root in enumerate(self.roots):
            for path, kind in self._walk(root):
                rel = path.relative_to(root).as_posix()
                rid = str(i) if rel == "." else f"{i}/{rel}"
                run = self.runs.get(rid)
                found[rid] = run if run is not None and type(run) is kind else kind(rid, path)
                found[rid].shown = self.names[i] if rel == "." else os.path.join(self.names[i], rel)
        self.runs = found
        return list(found.values())

    def _walk(self, root: Path) -> Iterable[tuple[Path, Any]]:
        stack = [(root, 0)]
        while stack:
            path, depth = stack.pop()
            kind = kind_of(path)
            if kind is not None:
                yield path, kind
                continue  # a run's own folders (instances, checkpoints) are not runs
            if depth >= WALK_DEPTH:
                continue
            try:
                subs = sorted((p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")), reverse=True)
            except OSError:
                continue
            stack.extend((p, depth + 1) for p in subs)

    def get(self, run_id: str) -> Run:
        if run_id not in self.runs:
            self.scan()
        return self.runs[run_id]


def compare(a: EvalRun, b: EvalRun) -> dict[str, Any]:
    """Per example: mean reward over each run's valid rollouts, the delta, and whether it
    flipped (solved in one run, by at least one rollout, and not in the other)."""
    def per_example(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for n, r in enumerate(rows):
            if r.get("bad"):
                continue
            e = out.setdefault(int(r["example_id"]), {"rewards": [], "errors": 0, "first": n})
            if r.get("error"):
                e["errors"] += 1
            else:
                e["rewards"].append(float(r.get("reward") or 0.0))
        return out

    ea, eb = per_example(a.records.rows()), per_example(b.records.rows())
    rows = []
    for ex in sorted(set(ea) | set(eb)):
        def side(e: dict[str, Any] | None) -> dict[str, Any] | None:
            if e is None:
                return None
            rw = e["rewards"]
            return {"reward": sum(rw) / len(rw) if rw else None, "solved": any(x >= 1.0 for x in rw),
                    "rollouts": len(rw), "errors": e["errors"], "first": e["first"]}
        sa, sb = side(ea.get(ex)), side(eb.get(ex))
        delta = (sb["reward"] - sa["reward"]) if sa and sb and sa["reward"] is not None and sb["reward"] is not None else None
        flip = None
        if sa and sb and sa["rollouts"] and sb["rollouts"] and sa["solved"] != sb["solved"]:
            flip = "gained" if sb["solved"] else "lost"
        rows.append({"example_id": ex, "a": sa, "b": sb, "delta": delta, "flip": flip})
    return {"a": a.card(), "b": b.card(), "examples": rows,
            "gained": sum(r["flip"] == "gained" for r in rows), "lost": sum(r["flip"] == "lost" for r in rows)}

