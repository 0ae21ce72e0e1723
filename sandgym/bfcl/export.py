"""sandgym BFCL runs as BFCL result files, and `bfcl evaluate` run on them.

`export_results` writes, from the records of one or more `sandgym eval bfcl_v4_*` runs,
`result/<model>/<group>/BFCL_v4_<category>_result.json` (JSON lines `{"id", "result"}`)
exactly where `bfcl evaluate` looks for them under its project root. A rollout that failed
(model unreachable, ...) is written as BFCL writes a failed inference: an error string.

`bfcl_evaluate` runs the package's own CLI (`bfcl evaluate --model M --test-category ...`)
on those files inside a sandgym/bfcl sandbox (it `eval`s the multi-turn calls) and reads
the per-category accuracy from the score files it writes. `compare` puts that next to
sandgym's own per-category mean reward for the same records.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .data import BFCL_IMAGE, BFCL_MODEL, MULTI_TURN_CATEGORIES, SINGLE_TURN_CATEGORIES, bfcl_module, load_entries

CATEGORIES = SINGLE_TURN_CATEGORIES + MULTI_TURN_CATEGORIES
BFCL_ROOT = "/tmp/bfcl"  # BFCL_PROJECT_ROOT in the sandgym/bfcl image


def load_records(run_dirs: Iterable[str | Path], rollout_index: int = 0) -> list[dict[str, Any]]:
    """The BFCL records of the runs (one per entry: the given rollout index)."""
    out: dict[str, dict[str, Any]] = {}
    source: dict[str, Path] = {}
    for d in run_dirs:
        path = Path(d) / "results.jsonl" if Path(d).is_dir() else Path(d)
        if not path.exists():
            raise FileNotFoundError(f"no results.jsonl in {d}")
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                info = rec.get("info") or {}
                if info.get("category") not in CATEGORIES or int(rec.get("rollout_index", 0)) != rollout_index:
                    continue
                if source.setdefault(info["id"], path) != path:
                    raise ValueError(f"{info['id']} is in both {source[info['id']]} and {path}: give the runs of one policy")
                out[info["id"]] = rec
    if not out:
        raise ValueError("no BFCL records (runs of bfcl_v4_single_turn / bfcl_v4_multi_turn) found")
    return list(out.values())


def bfcl_result_of(rec: dict[str, Any]) -> Any:
    info = rec.get("info") or {}
    if rec.get("error") and "bfcl_result" not in info:
        return f"Error during inference: {rec['error']}"
    return info.get("bfcl_result")


def export_results(records: list[dict[str, Any]], out_dir: str | Path, *, model: str = BFCL_MODEL) -> dict[str, int]:
    """Write BFCL result files under `out_dir` (a BFCL project root); returns entries per category."""
    utils = bfcl_module("utils")
    by_cat: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        info = rec["info"]
        by_cat[info["category"]].append({"id": info["id"], "result": bfcl_result_of(rec)})
    counts = {}
    for cat, rows in by_cat.items():
        folder = Path(out_dir) / "result" / model.replace("/", "_") / utils.get_directory_structure_by_category(cat)
        folder.mkdir(parents=True, exist_ok=True)
        rows.sort(key=utils.sort_key)
        with open(folder / f"BFCL_v4_{cat}_result.json", "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        counts[cat] = len(rows)
    return counts


def sandgym_accuracy(records: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """(correct, total) per category, from sandgym's own rewards."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for rec in records:
        a = acc[rec["info"]["category"]]
        a[0] += 1 if float(rec.get("reward") or 0.0) >= 1.0 else 0
        a[1] += 1
    return {k: (v[0], v[1]) for k, v in acc.items()}


def _tar_dir(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(root.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(root)), recursive=False)
    return buf.getvalue()


@dataclass
class BFCLEvaluation:
    scores: dict[str, tuple[int, int]]  # category -> (correct, total), from BFCL's score files
    command: str
    output_tail: str


async def bfcl_evaluate(
    project_root: str | Path, categories: list[str], *, model: str = BFCL_MODEL, partial: bool = False, provider: Any = "docker"
) -> BFCLEvaluation:
    """`bfcl evaluate` on the result files under `project_root`, in a sandgym/bfcl sandbox."""
    from sandgym.sandboxes import SandboxManager, SandboxSpec

    root = Path(project_root)
    cmd = ["bfcl", "evaluate", "--model", model, "--test-category", ",".join(categories)]
    if partial:
        cmd.append("--partial-eval")
    spec = SandboxSpec(image=BFCL_IMAGE, cpu=1.0, memory_mb=2048, disk_mb=512, exec_timeout_s=3600,
                       env={"OPENAI_API_KEY": "unused-by-evaluation"})  # fmt: skip
    async with SandboxManager(provider, max_sandboxes=1) as mgr, mgr.sandbox(spec) as sb:
        await sb.put_archive(BFCL_ROOT, _tar_dir(root))
        r = await sb.exec(cmd, timeout=3600, cwd=BFCL_ROOT)
        tail = (r.stdout + "\n" + r.stderr)[-3000:]
        if r.exit_code != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {r.exit_code}):\n{tail}")
        scores: dict[str, tuple[int, int]] = {}
        utils = bfcl_module("utils")
        for cat in categories:
            path = f"{BFCL_ROOT}/score/{model.replace('/', '_')}/{utils.get_directory_structure_by_category(cat)}/BFCL_v4_{cat}_score.json"
            head = json.loads((await sb.read_file(path)).decode().split("\n", 1)[0])
            scores[cat] = (int(head["correct_count"]), int(head["total_count"]))
    return BFCLEvaluation(scores=scores, command=" ".join(cmd), output_tail=tail)


def is_partial(counts: dict[str, int]) -> bool:
    return any(n < len(load_entries(cat)) for cat, n in counts.items())


def compare(ours: dict[str, tuple[int, int]], theirs: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    rows = []
    for cat in [c for c in CATEGORIES if c in ours or c in theirs]:
        o, t = ours.get(cat), theirs.get(cat)
        rows.append({
            "category": cat,
            "n": (o or t or (0, 0))[1],
            "sandgym": o[0] / o[1] if o and o[1] else None,
            "bfcl": t[0] / t[1] if t and t[1] else None,
            "sandgym_correct": o[0] if o else None,
            "bfcl_correct": t[0] if t else None,
            "agree": o == t,
        })  # fmt: skip
    return rows
