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
FORMAT = 3
CHUNK = 8 << 20
PROBE = 4096  # bytes hashed at the start and before the indexed end
HEAD_BYTES = 16 << 20
SAVE_EVERY_LINES = 20_000
SAVE_CHUNK = 5_000  # rows per line of the saved index

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

    def head(self, count: int, budget: int = HEAD_BYTES) -> list[tuple[int, int, bytes]]:
        """The first `count` complete lines that are not blank, with their spans, read
        directly (at most `budget` bytes: a huge first line waits for the index): a first
        page while the index is still being loaded or built."""
        out: list[tuple[int, int, bytes]] = []
        pos = 0
        with open(self.path, "rb") as f:
            while len(out) < count and pos < budget:
                line = f.readline(budget - pos + 1)
                if not line.endswith(b"\n"):
                    break
                if not line.isspace():
                    out.append((pos, pos + len(line), line[:-1]))
                pos += len(line)
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
        """A header line (what the index describes), then the rows in chunks of SAVE_CHUNK
        lines: loading parses one chunk at a time, so requests are answered meanwhile."""
        with self._lock:
            done, offsets, ends, rows = self.done, list(self.offsets), list(self.ends), list(self.rows)
        keys = list(dict.fromkeys(k for r in rows for k in r))  # columnar: the keys once
        try:
            with open(self.path, "rb") as f:
                header = {"format": FORMAT, "extractor": self.name, "inode": self._inode, "done": done, "lines": len(rows),
                          "keys": keys, "head": _probe(f, 0, min(PROBE, done)), "tail": _probe(f, done - PROBE, done)}
            tmp = self.index_path.with_name(self.index_path.name + f".{os.getpid()}.tmp")
            with open(tmp, "w", encoding="utf-8") as out:
                out.write(json.dumps(header) + "\n")
                for i in range(0, len(rows), SAVE_CHUNK):
                    chunk = {"offsets": offsets[i:i + SAVE_CHUNK], "ends": ends[i:i + SAVE_CHUNK],
                             "values": [[r.get(k) for k in keys] for r in rows[i:i + SAVE_CHUNK]]}
                    out.write(json.dumps(chunk, separators=(",", ":")) + "\n")
            os.replace(tmp, self.index_path)
        except OSError as exc:  # a read-only run folder: the index lives in memory only
            log.info("index of %s not saved: %s", self.path, exc)
            self.persist = False

    def _load_saved(self, st: os.stat_result) -> None:
        """The saved index when it still describes the file (else nothing: build anew),
        published chunk by chunk as it is read."""
        if not self.persist or not self.index_path.is_file():
            return
        try:
            with open(self.index_path, "rb") as saved:
                header = json.loads(saved.readline())
                done = int(header["done"])
                if (header.get("format") != FORMAT or header.get("extractor") != self.name or header.get("inode") != st.st_ino
                        or done > st.st_size):
                    return
                with open(self.path, "rb") as f:
                    if header["head"] != _probe(f, 0, min(PROBE, done)) or header["tail"] != _probe(f, done - PROBE, done):
                        return
                keys = header["keys"]
                for line in saved:
                    chunk = json.loads(line)
                    offsets, ends, values = chunk["offsets"], chunk["ends"], chunk["values"]
                    if not (len(offsets) == len(ends) == len(values)):
                        raise ValueError("a damaged chunk")
                    rows = [dict(zip(keys, v, strict=True)) for v in values]
                    with self._lock:
                        self.offsets.extend(offsets)
                        self.ends.extend(ends)
                        self.rows.extend(rows)
                if len(self.rows) != header["lines"]:
                    raise ValueError("chunks missing")
        except (OSError, ValueError, KeyError, TypeError):
            with self._lock:
                self._reset()  # unreadable or stale: build anew
            return
        with self._lock:
            self.done = done
