"""A SWE run's folder: sandgym.run_folder's (meta.json, results.jsonl, summary.json; the
same-run rule and resume of every sandgym run) plus a directory per instance:

    DIR/meta.json                     what was run (kind debug|validate, step, source, argv, started)
    DIR/results.jsonl                 one line per finished instance (its result without the
                                      per-test table and the diff), keyed by the instance's key
    DIR/<instance>/result.json        the instance's full result (no logs)
    DIR/<instance>/<name>.log         setup, step (the patch-apply log), test_patch, tests, image, crash
    DIR/<instance>/applied.diff       the working tree against base_commit before the tests
    DIR/summary.json                  written at the end (and rebuilt on --resume)

An instance is written the moment it finishes, before anything is rendered: its files first,
each whole or absent (temporary name, fsync, rename), then `result.json` the same way, then
its line in results.jsonl (one write, fsynced within a second: sandgym.run_folder). The line
is what makes it finished: a killed run leaves every finished instance whole on disk, and
`--resume` skips exactly those (an instance whose line never made it is run again). An
instance run again (`--retry-infra`) supersedes its earlier line.
Validation runs key results as `<instance>/<step>-<k>`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sandgym.run_folder import RESULTS, RunFolder, read_records, unit_key

RESULT = "result.json"
DIFF = "applied.diff"
LOG_SUFFIX = ".log"
# The kinds of SWE run (meta.json's "kind"): `sandgym swe debug` and `sandgym swe validate`.
DEBUG = "debug"
VALIDATE = "validate"
KINDS = (DEBUG, VALIDATE)
# What makes two SWE runs' results comparable (besides their kind).
SWE_IDENTITY = ("step",)


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


class RunStore:
    """A SWE run's folder. `start` opens it (a fresh run, or `resume`); the reading methods
    (`load`, `finished`) also work on a folder that is not open, e.g. after a run."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.folder: RunFolder | None = None

    def start(self, meta: Mapping[str, Any], *, resume: bool = False) -> dict[str, Any]:
        """Open the folder for a run of `meta["kind"]` (debug, validate): a fresh one, or with
        `resume` the one it holds (the same kind and step; sandgym.run_folder's rules)."""
        kind = str(meta["kind"])
        if kind not in KINDS:
            raise ValueError(f"a SWE run is one of {', '.join(KINDS)}, not {kind!r}")
        self.folder = RunFolder(self.root, kind=kind, identity=SWE_IDENTITY, key=unit_key)
        return self.folder.open({k: v for k, v in meta.items() if k != "kind"}, resume=resume)

    def _open(self) -> RunFolder:
        if self.folder is None:
            raise RuntimeError(f"the SWE run folder {self.root} is not open: call start()")
        return self.folder

    def dir_for(self, key: str) -> Path:
        return self.root / safe_name(key)

    def save(self, key: str, result: dict[str, Any], logs: Mapping[str, str], diff: str | None = None) -> Path:
        folder = self._open()
        rel = Path(safe_name(key))  # inside the folder: RunFolder.write_file takes paths relative to it
        for name, text in logs.items():
            folder.write_file(rel / f"{safe_name(name)}{LOG_SUFFIX}", text)
        if diff is not None:
            folder.write_file(rel / DIFF, diff)
        folder.write_file(rel / RESULT, json.dumps(result, indent=2) + "\n")
        folder.append({"key": key, **{k: v for k, v in result.items() if k not in ("tests", "applied_diff")}}, replace=True)
        return self.dir_for(key)

    def _recorded(self) -> set[Any]:
        if self.folder is not None and self.folder.is_open:
            return self.folder.done()
        return set(read_records(self.root / RESULTS, unit_key)[0])

    def load(self, key: str) -> dict[str, Any] | None:
        """The finished instance's full result (None: not finished)."""
        return self.finished([key]).get(key)

    def finished(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The full results of the instances among `keys` that finished: recorded in
        results.jsonl, with their result.json."""
        recorded = self._recorded()
        out = {}
        for k in keys:
            if k not in recorded:
                continue
            try:
                out[k] = json.loads((self.dir_for(k) / RESULT).read_text())
            except (OSError, ValueError):
                continue  # cannot happen through save(); treat a damaged file as not finished
        return out

    def write_summary(self, summary: dict[str, Any]) -> Path:
        return self._open().write_summary(summary)

    def write_file(self, name: str, text: str) -> Path:
        return self._open().write_file(name, text)

    def close(self) -> None:
        if self.folder is not None:
            self.folder.close()
