"""A SWE run directory, written as the run goes so that nothing is lost.

    DIR/run.json                      what was run (step, source, argv, started)
    DIR/results.jsonl                 one summary line per finished instance, appended
    DIR/<instance>/result.json        the instance's full result (no logs), written last
    DIR/<instance>/<name>.log         setup, step (the patch-apply log), test_patch, tests, image, crash
    DIR/<instance>/applied.diff       the working tree against base_commit before the tests
    DIR/summary.json                  written at the end (and rebuilt on --resume)

An instance is written the moment it finishes, before anything is rendered: files first,
each through a temporary name and a rename, then `result.json`, then its line in
results.jsonl (flushed and fsynced). A killed run leaves every finished instance whole on
disk; `finished()` is what `--resume` skips. Validation runs key results as
`<instance>/<step>-<k>`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESULT = "result.json"
RESULTS = "results.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"


def safe_name(key: str) -> str:
    """A directory name for an instance id (path separators and odd characters replaced;
    a short hash keeps two ids that map to the same name apart)."""
    parts = []
    for part in key.split("/"):
        clean = re.sub(r"[^A-Za-z0-9._+@=-]", "_", part).lstrip(".") or "_"
        if clean != part:
            clean += "~" + hashlib.sha256(part.encode()).hexdigest()[:8]
        parts.append(clean[:200])
    return "/".join(parts)


def _write(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def start(self, meta: dict[str, Any], *, resume: bool = False) -> dict[str, Any]:
        """Create the directory and run.json; on resume, check that the run is the same
        kind (`meta["kind"]`, `meta["step"]`) and keep the first run.json."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / RUN
        if path.exists():
            prev = json.loads(path.read_text())
            if not resume:
                raise FileExistsError(f"{self.root} already holds a run; use --resume {self.root} to continue it")
            for key in ("kind", "step"):
                if prev.get(key) != meta.get(key):
                    raise ValueError(f"{self.root} holds a run with {key}={prev.get(key)!r}, not {meta.get(key)!r}")
            prev.setdefault("resumed", []).append(time.strftime("%Y-%m-%dT%H:%M:%S"))
            _write(path, json.dumps(prev, indent=2) + "\n")
            return prev
        meta = {**meta, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        _write(path, json.dumps(meta, indent=2) + "\n")
        return meta

    def dir_for(self, key: str) -> Path:
        return self.root / safe_name(key)

    def save(self, key: str, result: dict[str, Any], logs: dict[str, str], diff: str | None = None) -> Path:
        d = self.dir_for(key)
        d.mkdir(parents=True, exist_ok=True)
        for name, text in logs.items():
            _write(d / f"{safe_name(name)}.log", text)
        if diff is not None:
            _write(d / "applied.diff", diff)
        _write(d / RESULT, json.dumps(result, indent=2) + "\n")
        line = json.dumps({"key": key, **{k: v for k, v in result.items() if k not in ("tests", "applied_diff")}})
        with open(self.root / RESULTS, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        return d

    def load(self, key: str) -> dict[str, Any] | None:
        p = self.dir_for(key) / RESULT
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError:
            return None  # cannot happen through save(); treat a damaged file as not finished

    def finished(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        out = {}
        for k in keys:
            r = self.load(k)
            if r is not None:
                out[k] = r
        return out

    def write_summary(self, summary: dict[str, Any]) -> Path:
        _write(self.root / SUMMARY, json.dumps(summary, indent=2) + "\n")
        return self.root / SUMMARY
