"""`sandgym view` on a big results.jsonl: how long until a page is there, compared with
json-loading the whole file (what a viewer without an index would do first), measured in
the same run.

The file: 100,000 rollout records (default) written the way `sandgym eval` writes them
(State's JSON, one line each), each with two turns, a tool call and its result, token ids
and logprobs, padded to about --record-kb KB (default 10: about 1 GB in all). Then a second
file with one record of --big-mb MB (default 240) of model output.

Measured over real HTTP against the viewer's app (uvicorn on 127.0.0.1):
- cold open: the first rollouts page of a file never opened (no saved index; the first
  page comes from the file's head while it is indexed);
- cold index: until the whole file is indexed (filters and sorting over every record);
- warm open: a fresh server with the saved index: the first page, and until the whole
  saved index is loaded;
- page: a page deep in the file sorted by reward (median of 20);
- trajectory: one record's page (median of 20);
- grow: 1,000 more records appended: until the index covers them;
- big record: the first open of the 240 MB record's file, and its trajectory page (cut).
Baselines: reading + json.loads of every line (the big file: of its one line).

    python benchmarks/view_open.py [--records N] [--record-kb K] [--big-mb M] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandgym.core.evaluation import record_of
from sandgym.core.state import State, Turn, TurnTokens
from sandgym.uvicorn_thread import UvicornThread
from sandgym.view.app import create_app


def template(pad: int) -> State:
    tokens = TurnTokens(prompt_ids=list(range(200)), completion_ids=list(range(100)), completion_logprobs=[-0.25] * 100)
    call = {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls -la /testbed"})}}
    turns = [
        Turn(prompt=[{"role": "user", "content": "Fix the bug."}], completion={"role": "assistant", "content": "x" * pad, "tool_calls": [call]},
             env_response=[{"role": "tool", "tool_call_id": "c0", "content": "total 0\n[exit code 1]"}], finish_reason="tool_calls", tokens=tokens),
        Turn(prompt=[{"role": "user", "content": "Fix the bug."}], completion={"role": "assistant", "content": "done"}, finish_reason="stop", tokens=tokens),
    ]
    return State(env="bench", prompt=[{"role": "user", "content": "Fix the bug."}], turns=turns, completion=[t.completion for t in turns],
                 metrics={"passes": 0.0}, usage={"prompt_tokens": 400, "completion_tokens": 200}, stop_reason="no_tools_called")


def write_results(path: Path, n: int, record_kb: int) -> int:
    """n records, varied in ids, reward and errors, without serializing each from scratch."""
    overhead = len(json.dumps(record_of(template(0))))
    base = template(max(0, record_kb * 1024 - overhead) // 2)  # the reply is in the record twice (turns, completion)
    rec = record_of(base)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            rec["id"], rec["example_id"], rec["rollout_index"] = f"{i:032x}", i // 4, i % 4
            rec["reward"] = (i * 7919 % 1000) / 1000
            rec["error"], rec["error_kind"] = (("sandbox: gone", "sandbox") if i % 97 == 0 else (None, None))
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path.stat().st_size


def write_big(path: Path, mb: int) -> int:
    rec = record_of(template(0))
    # The reply is in the record twice (its turn and the completion): half the size each.
    rec["turns"][0]["completion"]["content"] = rec["completion"][0]["content"] = "The model rambles on. " * (mb * 1_000_000 // 44)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    return path.stat().st_size


def baseline(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    dt = time.perf_counter() - t0
    del recs
    return dt


class Server:
    def __init__(self, root: Path) -> None:
        self.server = UvicornThread(create_app([root]), name="sandgym-view")
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}"
        self.http = httpx.Client(base_url=self.url, timeout=600)

    def get(self, path: str, **params: Any) -> tuple[float, dict[str, Any], int]:
        t0 = time.perf_counter()
        r = self.http.get(path, params=params)
        dt = time.perf_counter() - t0
        r.raise_for_status()
        return dt, r.json(), len(r.content)

    def close(self) -> None:
        self.http.close()
        self.server.stop()


def until_indexed(srv: Server, run: str, want: int, t0: float) -> float:
    while True:
        _, page, _ = srv.get("/api/rollouts", run=run, limit=1)
        if page["total"] >= want and not page["indexing"]["building"]:
            return time.perf_counter() - t0
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--record-kb", type=int, default=10)
    ap.add_argument("--big-mb", type=int, default=240)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temporary folder)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="view-bench-", dir=args.dir))
    try:
        run(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, args: argparse.Namespace) -> None:
    many, big = root / "many", root / "big"
    many.mkdir()
    big.mkdir()
    t0 = time.perf_counter()
    size = write_results(many / "results.jsonl", args.records, args.record_kb)
    big_size = write_big(big / "results.jsonl", args.big_mb)
    print(f"wrote {args.records:,} records ({size / 1e9:.2f} GB) and one {big_size / 1e6:.0f} MB record in {time.perf_counter() - t0:.1f}s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)

    base_many = baseline(many / "results.jsonl")
    base_big = baseline(big / "results.jsonl")

    srv = Server(root)
    t0 = time.perf_counter()
    cold_first, page, _ = srv.get("/api/rollouts", run="0/many", limit=50)
    cold_index = until_indexed(srv, "0/many", args.records, t0)
    srv.close()

    srv = Server(root)  # a fresh process state: the saved index next to the file
    t0 = time.perf_counter()
    warm, page, _ = srv.get("/api/rollouts", run="0/many", limit=50)
    warm_all = until_indexed(srv, "0/many", args.records, t0)
    pages = [srv.get("/api/rollouts", run="0/many", offset=(i * 4999) % args.records, limit=50, sort="reward", desc="true")[0] for i in range(20)]
    records = [srv.get("/api/record", run="0/many", n=(i * 4999) % args.records)[0] for i in range(20)]
    more = write_more(many / "results.jsonl", 1000, args.record_kb)
    t0 = time.perf_counter()
    grow = until_indexed(srv, "0/many", args.records + more, t0)
    t0 = time.perf_counter()
    big_first, bpage, _ = srv.get("/api/rollouts", run="0/big", limit=50)
    big_index = until_indexed(srv, "0/big", 1, t0)
    big_record, rec, big_bytes = srv.get("/api/record", run="0/big", n=0)
    assert rec["truncated"], "the big reply should come cut"
    srv.close()

    med = statistics.median
    rows = [
        ("cold open: first page", cold_first, base_many),
        ("cold: whole file indexed", cold_index, base_many),
        ("warm open (saved index): first page", warm, base_many),
        ("warm: saved index loaded (every record)", warm_all, base_many),
        ("page, sorted by reward (median of 20)", med(pages), base_many),
        ("trajectory page (median of 20)", med(records), base_many),
        ("1,000 records appended: indexed", grow, base_many),
        (f"{args.big_mb} MB record: first open", big_first + big_index, base_big),
        (f"{args.big_mb} MB record: trajectory page ({big_bytes / 1e3:.0f} kB sent)", big_record, base_big),
    ]
    print(f"\nbaseline: json.loads of every line: {base_many:.2f}s ({args.records:,} records, {size / 1e9:.2f} GB); "
          f"of the {args.big_mb} MB line: {base_big:.2f}s")
    print("| step | viewer (s) | baseline (s) | viewer / baseline |")
    print("| --- | --- | --- | --- |")
    for name, t, b in rows:
        print(f"| {name} | {t:.3f} | {b:.2f} | {t / b:.3f} |")


def write_more(path: Path, n: int, record_kb: int) -> int:
    extra = path.with_name("extra.jsonl")
    write_results(extra, n, record_kb)
    with open(path, "ab") as f, open(extra, "rb") as g:
        shutil.copyfileobj(g, f)
    extra.unlink()
    return n


if __name__ == "__main__":
    main()
