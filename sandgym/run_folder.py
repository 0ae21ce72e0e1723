"""Run folders: what `sandgym eval` (on one machine or on a Ray fleet), `sandgym swe debug` and
`sandgym swe validate` write, and how such a run is resumed. One module, so every run has the
same meta, the same same-run rule, the same resume and the same summary file.

    DIR/meta.json      what was run: its kind, the fields that make its records comparable,
                       argv, when it started and each time it was resumed
    DIR/results.jsonl  one record per finished unit (a rollout; a SWE instance), appended as
                       that unit finishes
    DIR/summary.json   the summary over every record, rewritten when the run (or a resume) ends

Durability. A record is one write(2) of one whole line, made the moment its unit finishes:
from then on it is the kernel's, so a killed process (SIGKILL, the OOM killer) loses
nothing. A background thread fsyncs the file within `fsync_every_s` (1 s) of a write, and
closing the log fsyncs it: a machine crash or a power loss loses at most the records of the
last second. (fsync per record would block the event loop that runs the rollouts.)
meta.json, summary.json and every file written with `write_file` go through a temporary
file, fsync and rename: each is whole or absent. A line cut short (a crash mid-write) is
dropped, and the file repaired, when the folder is opened again.

The same-run rule. A folder holds one run. Its meta names the run's `kind` (eval, debug,
validate) and the fields that make its records comparable (an eval: env, model, sampling
args, policy, checkpoint, env args; a SWE run: its step). Resuming with any of those
different is refused with one line naming the first difference: the summary would mix two
runs. Fields that only extend a run (more examples or rollouts, another concurrency, a Ray
cluster instead of one machine) may change.

Resume. Records are keyed (an eval's by example id and rollout index, a SWE run's by the
instance's key); a resumed run skips the keys already recorded. A fresh run refuses a folder
that already holds a run's records (resume it instead), and a resume refuses a folder that
holds no run at all.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import UserError

META = "meta.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"

KeyFn = Callable[[Mapping[str, Any]], Hashable]


def rollout_key(record: Mapping[str, Any]) -> tuple[int, int]:
    """An eval record's key: (example_id, rollout_index)."""
    return int(record["example_id"]), int(record["rollout_index"])


def unit_key(record: Mapping[str, Any]) -> str:
    """A SWE record's key: the instance's key (`<instance>` or `<instance>/<step>-<k>`)."""
    return str(record["key"])


class RunMismatchError(UserError):
    """The folder holds another run's records; continuing would mix two runs."""


def write_file(path: Path, text: str) -> None:
    """Write `text` whole or not at all: a temporary file, fsync, rename, fsync of the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def as_json(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`doc` as it reads back from a JSON file (tuples become lists, paths strings)."""
    out: dict[str, Any] = json.loads(json.dumps(dict(doc), default=str))
    return out


def _read_doc(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path` (None: no such file, or not a JSON object)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_meta(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The meta of the run a folder holds (None: no readable meta.json)."""
    return _read_doc(Path(root) / META)


def read_summary(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The summary of a run that ended (None: none readable; a run still going, or killed,
    has none yet)."""
    return _read_doc(Path(root) / SUMMARY)


def read_records(path: Path, key: KeyFn) -> tuple[dict[Hashable, dict[str, Any]], dict[Hashable, str], bool]:
    """The records of a results file by key (the last record of a key wins), their lines, and
    whether the file needs repair (a torn or unreadable line, a key recorded twice)."""
    records: dict[Hashable, dict[str, Any]] = {}
    lines: dict[Hashable, str] = {}
    dirty = False
    if not path.exists():
        return records, lines, dirty
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                dirty = True  # a partial last line from a killed run
                continue
            try:
                rec = json.loads(line)
                k = key(rec)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                dirty = True
                continue
            if k in lines:
                dirty = True
                del lines[k], records[k]  # the later record of a key is the one kept, in its place
            lines[k] = line
            records[k] = rec
    return records, lines, dirty


class RecordLog:
    """Append-only JSON lines, one record per key. `append` writes a record's line with one
    write(2) (see the module's Durability); a background thread fsyncs within `fsync_every_s`
    of a write. Reopening drops a torn last line and keeps the last record of each key (an
    instance run again replaces its earlier record), rewriting the file when it changed."""

    def __init__(self, path: Path, *, key: KeyFn = rollout_key, fsync_every_s: float = 1.0) -> None:
        self.path = path
        self.key = key
        self.fsync_every_s = fsync_every_s
        self.records: dict[Hashable, dict[str, Any]] = {}
        if path.exists():
            self._load_and_repair()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._dirty = False
        self._closing = threading.Event()
        self._syncer = threading.Thread(target=self._sync_loop, name=f"fsync {path}", daemon=True)
        self._syncer.start()

    def _load_and_repair(self) -> None:
        self.records, lines, dirty = read_records(self.path, self.key)
        if dirty:
            write_file(self.path, "".join(lines.values()))

    def _sync_loop(self) -> None:
        while not self._closing.wait(self.fsync_every_s):
            if self._dirty:
                # Cleared before the fsync: a write racing with it is covered by this fsync
                # or marks the log dirty again for the next round.
                self._dirty = False
                os.fsync(self._fd)

    def done(self) -> set[Hashable]:
        return set(self.records)

    def append(self, record: dict[str, Any], *, replace: bool = False) -> bool:
        """Write `record` now; False (and nothing written) when its key is recorded already,
        unless `replace` (the record then supersedes the earlier one)."""
        k = self.key(record)
        if k in self.records and not replace:
            return False
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        os.write(self._fd, line)
        self._dirty = True
        self.records[k] = record
        return True

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        self._syncer.join()
        os.fsync(self._fd)
        os.close(self._fd)


class RunFolder:
    """One run's folder (see the module docstring). `kind` and `identity` are the same-run
    rule's fields; `key` keys the records. `open` checks and writes the meta and opens the
    record log; `close` makes the records durable."""

    def __init__(self, root: str | os.PathLike[str], *, kind: str, identity: Sequence[str] = (), key: KeyFn = rollout_key) -> None:
        self.root = Path(root)
        self.kind = kind
        self.identity = ("kind", *identity)
        self.key = key
        self.meta: dict[str, Any] = {}
        self._log: RecordLog | None = None

    # ---- meta and the same-run rule --------------------------------------------------

    def previous_meta(self) -> dict[str, Any] | None:
        """The meta of the run this folder holds (None: no readable meta)."""
        return read_meta(self.root)

    def holds_run(self) -> bool:
        """The folder holds a run's records (a meta alone is a run that never recorded one:
        starting afresh over it loses nothing)."""
        results = self.root / RESULTS
        return results.exists() and results.stat().st_size > 0

    def check(self, meta: Mapping[str, Any], *, resume: bool | None = None) -> dict[str, Any] | None:
        """Raise a UserError when `meta`'s run may not start here: `resume=True` and the folder
        holds no run, `resume=False` and it holds one, or it holds another run (the same-run
        rule). Returns the meta of the run this one continues, if any."""
        held = self.holds_run()
        prev = self.previous_meta()
        if resume is True and not held and prev is None:
            raise UserError(f"nothing to resume in {self.root} (no {META} or {RESULTS})")
        if resume is False:
            if held:
                raise UserError(f"{self.root} already holds a run; use --resume {self.root} to continue it, or choose another output folder")
            return None  # a fresh run (over a meta that never got a record, if any)
        if prev is not None:
            cur = as_json({"kind": self.kind, **meta})
            for field in self.identity:
                if field in prev and field in cur and prev[field] != cur[field]:
                    raise RunMismatchError(
                        f"{self.root} holds another run ({field}: {prev[field]!r}, now {cur[field]!r}); "
                        "resuming would mix them: choose another output folder or remove that one"
                    )
        return prev

    def open(self, meta: Mapping[str, Any], *, resume: bool | None = None) -> dict[str, Any]:
        """Check (`check`), write meta.json (a resume keeps when the run started and adds when
        it was resumed) and open the record log. Returns the meta written."""
        self.root.mkdir(parents=True, exist_ok=True)
        prev = self.check(meta, resume=resume)
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        doc = as_json({"kind": self.kind, **meta})
        if prev is not None:
            doc["started"] = prev.get("started", now)
            doc["resumed"] = [*prev.get("resumed", []), now]
        else:
            doc["started"] = now
        self.meta = doc
        write_file(self.root / META, json.dumps(doc, indent=2) + "\n")
        self._log = RecordLog(self.root / RESULTS, key=self.key)
        return doc

    def update_meta(self, fields: Mapping[str, Any]) -> None:
        """Add what became known after the start (a fleet's layout, say) to meta.json."""
        self.meta = {**self.meta, **as_json(fields)}
        write_file(self.root / META, json.dumps(self.meta, indent=2) + "\n")

    # ---- records -----------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._log is not None

    @property
    def log(self) -> RecordLog:
        if self._log is None:
            raise RuntimeError(f"the run folder {self.root} is not open")
        return self._log

    @property
    def records(self) -> dict[Hashable, dict[str, Any]]:
        return self.log.records

    def done(self) -> set[Hashable]:
        return self.log.done()

    def append(self, record: dict[str, Any], *, replace: bool = False) -> bool:
        return self.log.append(record, replace=replace)

    def records_of(self, keys: Iterable[Hashable]) -> list[dict[str, Any]]:
        """The records of `keys` that are recorded, in the order of `keys`."""
        recs = self.log.records
        return [recs[k] for k in keys if k in recs]

    # ---- files -------------------------------------------------------------------------

    def write_file(self, relpath: str | os.PathLike[str], text: str) -> Path:
        """Write `relpath`, a path relative to the folder, whole or not at all."""
        rel = Path(relpath)
        if rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"not a path inside the run folder: {relpath}")
        path = self.root / rel
        write_file(path, text)
        return path

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        return self.write_file(SUMMARY, json.dumps(dict(summary), indent=2, default=str) + "\n")

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
