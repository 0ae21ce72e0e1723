"""An offset index of a JSONL file that may be huge and may still be growing.

The viewer never loads a results file whole. It scans it once for line starts and, per
line, a few small columns (reward, error kind, turns, ...) that the rollouts table filters
and sorts on; a page then reads just its lines by offset. The scan runs in a background
thread, so the first page is there at once while a 1 GB file is still being indexed.

The index is kept next to the file (`results.jsonl.index`, JSON: columns, not pickle, since
run folders are other people's files) and reused on the next open when it still describes
the file: same inode, the file at least as long, and the same bytes at the start and just
before the indexed end. A file that grew (a live run) is indexed from where the index
stopped; a file that was rewritten (a resume that repaired a torn line) is indexed anew.
Only complete lines count: a half-written last line waits for its newline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".index"
FORMAT = 2
CHUNK = 8 << 20
PROBE = 4096  # bytes hashed at the start and before the indexed end
SAVE_EVERY_LINES = 20_000

Extractor = Callable[[bytes], dict[str, Any]]


def _probe(f: Any, start: int, end: int) -> str:
    f.seek(max(0, start))
    return hashlib.sha256(f.read(max(0, end - max(0, start)))).hexdigest()


class JsonlIndex:
    """Line offsets and per-line columns of one JSONL file. `refresh()` (cheap: a stat)
    starts indexing whatever was appended; readers see the lines indexed so far."""

    def __init__(self, path: Path, extract: Extractor, *, name: str, persist: bool = True) -> None:
        self.path = path
        self.extract = extract
        self.name = name  # part of the saved index: another extractor means other columns
        self.persist = persist
        self.index_path = path.with_name(path.name + INDEX_SUFFIX)
        self.offsets: list[int] = []
        self.ends: list[int] = []
        self.rows: list[dict[str, Any]] = []
        self.done = 0  # bytes indexed (always at a line boundary)
        self.size = 0  # the file's size when last looked at
        self._inode: int | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loaded = False
        self.error: str | None = None

    # ---- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def building(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def progress(self) -> dict[str, Any]:
        return {"indexed_bytes": self.done, "size": self.size, "lines": len(self.offsets), "building": self.building}

    def snapshot(self) -> tuple[list[dict[str, Any]], int]:
        """The rows indexed so far (a copy of the list, not of the rows) and how many."""
        with self._lock:
            return list(self.rows), len(self.rows)

    def span(self, n: int) -> tuple[int, int]:
        with self._lock:
            return self.offsets[n], self.ends[n]

    def read_line(self, n: int, limit: int | None = None) -> bytes:
        start, end = self.span(n)
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start if limit is None else min(limit, end - start))

    def read_head(self, count: int) -> list[bytes]:
        """The first `count` complete lines, read directly (before an index exists)."""
        out: list[bytes] = []
        with open(self.path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n") or len(out) >= count:
                    break
                out.append(line)
        return out

    # ---- building ------------------------------------------------------------------------

    def refresh(self, wait_s: float | None = 0.0) -> None:
        """Look at the file; index what is new in a background thread, waiting for it up to
        `wait_s` seconds (None: until done). A small file is then whole at once; a big one
        is paged while it is indexed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        with self._lock:
            replaced = self._inode is not None and (st.st_ino != self._inode or st.st_size < self.done)
            if self._loaded and replaced and not self.building:
                self._reset()  # replaced or cut: start over
            self.size = st.st_size
            if (not self._loaded or st.st_size > self.done) and not self.building:
                self._thread = threading.Thread(target=self._build, args=(st,), name=f"index {self.path}", daemon=True)
                self._thread.start()
            thread = self._thread
        if thread is not None and (wait_s is None or wait_s > 0):
            thread.join(wait_s)

    def _reset(self) -> None:
        self.offsets, self.ends, self.rows, self.done = [], [], [], 0

    def _build(self, st: os.stat_result) -> None:
        if not self._loaded:
            self._loaded = True
            self._load_saved(st)
        self._inode = st.st_ino
        try:
            self._scan()
        except Exception as exc:  # a read error must not kill the server; say it
            log.warning("indexing %s failed: %s", self.path, exc)
            self.error = f"indexing failed: {exc}"
        if self.persist:
            self._save()

    def _scan(self) -> None:
        since_save = 0
        with open(self.path, "rb") as f:
            f.seek(self.done)
            base = line_start = self.done  # file offsets of the chunk and of the open line
            pending: list[bytes] = []  # a line longer than a chunk, in parts (joined once)
            while chunk := f.read(CHUNK):
                offs, ends, rows = [], [], []
                start = 0
                while (nl := chunk.find(b"\n", start)) >= 0:
                    if pending:
                        pending.append(chunk[start:nl])
                        line, pending = b"".join(pending), []
                    else:
                        line = chunk[start:nl]
                    end = base + nl + 1
                    if line and not line.isspace():
                        offs.append(line_start)
                        ends.append(end)
                        rows.append(self._extract(line))
                    line_start, start = end, nl + 1
                if start < len(chunk):
                    pending.append(chunk[start:])
                base += len(chunk)
                with self._lock:
                    self.offsets.extend(offs)
                    self.ends.extend(ends)
                    self.rows.extend(rows)
                    self.done = line_start
                since_save += len(offs)
                if self.persist and since_save >= SAVE_EVERY_LINES:
                    since_save = 0
                    self._save()

    def _extract(self, line: bytes) -> dict[str, Any]:
        try:
            return self.extract(line)
        except Exception as exc:
            return {"bad": f"{type(exc).__name__}: {exc}"[:300]}

    # ---- keeping it next to the file -----------------------------------------------------

    def _save(self) -> None:
        with self._lock:
            done, rows = self.done, list(self.rows)
            doc: dict[str, Any] = {"format": FORMAT, "extractor": self.name, "inode": self._inode, "done": done,
                                   "offsets": list(self.offsets), "ends": list(self.ends)}
        # Columnar: the keys once, then each row's values in their order.
        keys = list(dict.fromkeys(k for r in rows for k in r))
        doc["keys"], doc["values"] = keys, [[r.get(k) for k in keys] for r in rows]
        try:
            with open(self.path, "rb") as f:
                doc["head"] = _probe(f, 0, min(PROBE, done))
                doc["tail"] = _probe(f, done - PROBE, done)
            tmp = self.index_path.with_name(self.index_path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
            os.replace(tmp, self.index_path)
        except OSError as exc:  # a read-only run folder: the index lives in memory only
            log.info("index of %s not saved: %s", self.path, exc)
            self.persist = False

    def _load_saved(self, st: os.stat_result) -> None:
        """The saved index when it still describes the file (else nothing: build anew)."""
        if not self.persist or not self.index_path.is_file():
            return
        try:
            doc = json.loads(self.index_path.read_bytes())
            if doc.get("format") != FORMAT or doc.get("extractor") != self.name or doc.get("inode") != st.st_ino:
                return
            done = int(doc["done"])
            if done > st.st_size:
                return
            with open(self.path, "rb") as f:
                if doc["head"] != _probe(f, 0, min(PROBE, done)) or doc["tail"] != _probe(f, done - PROBE, done):
                    return
            offsets, ends, keys, values = doc["offsets"], doc["ends"], doc["keys"], doc["values"]
            if not (len(offsets) == len(ends) == len(values)):
                return
            rows = [dict(zip(keys, v)) for v in values]
        except (OSError, ValueError, KeyError, TypeError):
            return  # unreadable or stale: build anew
        with self._lock:
            self.offsets, self.ends, self.rows, self.done = offsets, ends, rows, done
