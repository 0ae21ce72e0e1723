"""sandgym BFCL runs as BFCL result files, and `bfcl evaluate` run on them.

`export_results` writes, from the records of one or more `sandgym eval bfcl_v4_*` runs,
`result/<model>/<group>/BFCL_v4_<category>_result.json` (JSON lines `{"id", "result"}`)
exactly where `bfcl evaluate` looks for them under its project root.

Failed rollouts (the rule). A rollout whose model call failed (an HTTP 500 after the
retries, a timeout), whose sandbox died or whose scoring could not decide is an
infrastructure failure: sandgym keeps it out of its scores (reward_mean, pass@k, and the
per-category accuracy here), so the export keeps it out of BFCL's too. It is not written
to the result files, and `bfcl evaluate` runs with `--partial-eval`, which scores exactly
the entries present. Writing it as BFCL's own inference loop does ("Error during
inference: ...") would make BFCL score it as a reply without calls: right on irrelevance
and live_irrelevance, wrong elsewhere, a verdict on a policy that never answered. So for
every entry both sides agree: a verdict when the rollout ran, no verdict when it failed.
Run the failed rollouts again for a full-set score.

`bfcl_evaluate` runs the package's own CLI (`bfcl evaluate --model M --test-category ...`)
on those files inside a sandgym/bfcl sandbox (it `eval`s the multi-turn calls) and reads
the per-category accuracy, and which entries it scored wrong, from the score files it
writes. `compare` puts that next to sandgym's own per-category accuracy for the same
records, entry by entry.
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


def scored(rec: dict[str, Any]) -> bool:
    """The rollout ran (no infrastructure failure): both sides give it a verdict."""
    return not rec.get("error")


def failed_by_category(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The entries whose rollout failed (left out of both scores), per category."""
    out: dict[str, list[str]] = defaultdict(list)
    for rec in records:
        if not scored(rec):
            out[rec["info"]["category"]].append(rec["info"]["id"])
    return dict(out)


def export_results(records: list[dict[str, Any]], out_dir: str | Path, *, model: str = BFCL_MODEL) -> dict[str, int]:
    """Write BFCL result files under `out_dir` (a BFCL project root) for the rollouts that
    ran (failed ones are left out: the module's rule); returns entries written per category."""
    utils = bfcl_module("utils")
    by_cat: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if not scored(rec):
            continue
        info = rec["info"]
        by_cat[info["category"]].append({"id": info["id"], "result": info.get("bfcl_result")})
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


def sandgym_verdicts(records: list[dict[str, Any]]) -> dict[str, dict[str, bool]]:
    """category -> entry id -> sandgym's verdict (reward 1), for the rollouts that ran."""
    out: dict[str, dict[str, bool]] = defaultdict(dict)
    for rec in records:
        if scored(rec):
            out[rec["info"]["category"]][rec["info"]["id"]] = float(rec.get("reward") or 0.0) >= 1.0
    return dict(out)


def sandgym_accuracy(records: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """(correct, total) per category, from sandgym's own rewards, over the rollouts that ran
    (as reward_mean is): failed ones are in neither count."""
    return {cat: (sum(v.values()), len(v)) for cat, v in sandgym_verdicts(records).items()}


def _tar_dir(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(root.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(root)), recursive=False)
    return buf.getvalue()


@dataclass
class BFCLEvaluation:
    scores: dict[str, tuple[int, int]]  # category -> (correct, total), from BFCL's score files
    wrong: dict[str, set[str]]  # category -> the entry ids BFCL scored wrong (its score files list them)
    command: str
    output_tail: str


def read_score_file(text: str) -> tuple[tuple[int, int], set[str]]:
    """A BFCL score file: its header's (correct, total) and the ids of the entries it lists
    (every entry scored wrong)."""
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    head = lines[0]
    return (int(head["correct_count"]), int(head["total_count"])), {str(x["id"]) for x in lines[1:]}


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
        wrong: dict[str, set[str]] = {}
        for cat in categories:
            text = (await sb.read_file(f"{BFCL_ROOT}/{score_path(cat, model)}")).decode()
            scores[cat], wrong[cat] = read_score_file(text)
    return BFCLEvaluation(scores=scores, wrong=wrong, command=" ".join(cmd), output_tail=tail)


def score_path(category: str, model: str = BFCL_MODEL) -> str:
    """Where `bfcl evaluate` writes a category's score file, under its project root."""
    utils = bfcl_module("utils")
    return f"score/{model.replace('/', '_')}/{utils.get_directory_structure_by_category(category)}/BFCL_v4_{category}_score.json"


def is_partial(counts: dict[str, int]) -> bool:
    return any(n < len(load_entries(cat)) for cat, n in counts.items())


def disagreements(records: list[dict[str, Any]], ev: BFCLEvaluation) -> dict[str, list[str]]:
    """category -> the entries on which sandgym's verdict and BFCL's differ (an entry BFCL
    did not score while sandgym did counts too)."""
    out: dict[str, list[str]] = {}
    for cat, verdicts in sandgym_verdicts(records).items():
        wrong = ev.wrong.get(cat)
        bad = sorted(i for i, ok in verdicts.items() if wrong is None or ok == (i in wrong))
        if bad:
            out[cat] = bad
    return out


def compare(records: list[dict[str, Any]], ev: BFCLEvaluation) -> list[dict[str, Any]]:
    """Per category: sandgym's accuracy and BFCL's over the same entries, the failed rollouts
    left out of both, and whether they agree: the same counts, entry by entry."""
    ours, theirs = sandgym_accuracy(records), ev.scores
    failed = failed_by_category(records)
    differ = disagreements(records, ev)
    rows = []
    for cat in [c for c in CATEGORIES if c in ours or c in theirs or c in failed]:
        o, t = ours.get(cat, (0, 0)), theirs.get(cat, (0, 0))
        rows.append({
            "category": cat,
            "n": o[1],
            "failed": len(failed.get(cat, [])),
            "sandgym": o[0] / o[1] if o[1] else None,
            "bfcl": t[0] / t[1] if t[1] else None,
            "sandgym_correct": o[0],
            "bfcl_correct": t[0],
            "differ": differ.get(cat, []),
            "agree": o == t and cat not in differ,
        })  # fmt: skip
    return rows
