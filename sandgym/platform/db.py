"""The server's state on disk: one SQLite file per state directory.

- `sandboxes`: one row per sandbox record, written before its container is created, so no
  container exists that the server does not know (containers carry `platform.id`, the join
  key). Searchable columns plus the rest of the record as JSON (`data`).
- `idempotency`: (tenant, key) -> sandbox id.
- `events`: the per-sandbox event log (`GET /sandbox/{id}/logs`).
- `meta`: schema version and this state's instance id.

WAL with synchronous=NORMAL: a commit is a write to the log, no fsync; a crash loses at most
the last transactions since a checkpoint, never corrupts. One connection, used only from the
server's event loop thread. A second server on the same directory is refused (flock).

A write the directory cannot take (a full disk, a read-only mount) raises StateWriteError and
changes nothing: SQLite rolls the statement or transaction back.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  status TEXT NOT NULL,
  created_at REAL NOT NULL,
  ended_at REAL,
  last_active REAL,
  data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_status ON sandboxes(status);
CREATE TABLE IF NOT EXISTS idempotency (
  tenant TEXT NOT NULL, key TEXT NOT NULL, sandbox_id TEXT NOT NULL,
  PRIMARY KEY (tenant, key)
);
CREATE TABLE IF NOT EXISTS events (sandbox_id TEXT NOT NULL, line TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_sb ON events(sandbox_id);
"""


class StateLocked(RuntimeError):
    """Another server holds this state directory."""


class StateWriteError(OSError):
    """The state directory did not take a write (full, read-only, failing): nothing of it was
    recorded."""


class StateDB:
    """SQLite state of one server. `path=None` keeps it in memory (nothing survives)."""

    def __init__(self, state_dir: str | os.PathLike[str] | None) -> None:
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else None
        self._lock_fd: int | None = None
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._lock_fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_fd)
                self._lock_fd = None
                raise StateLocked(f"another `sandgym serve` uses the state directory {self.state_dir}") from None
            path = str(self.state_dir / "sandboxes.db")
        else:
            path = ":memory:"
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        if self.state_dir is not None:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)
        version = self.get_meta("schema_version")
        if version is None:
            self.set_meta("schema_version", str(SCHEMA_VERSION))
        elif int(version) != SCHEMA_VERSION:
            raise RuntimeError(f"state {path} has schema {version}; this sandgym reads {SCHEMA_VERSION}")
        self.instance_id = self.get_meta("instance_id") or self._new_instance()

    @property
    def persistent(self) -> bool:
        return self.state_dir is not None

    def _new_instance(self) -> str:
        iid = uuid.uuid4().hex[:12]
        self.set_meta("instance_id", iid)
        return iid

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    # ---- meta ----------------------------------------------------------------------------

    @contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:  # SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR, ...
            where = self.state_dir or "memory"
            raise StateWriteError(f"the server's state ({where}) did not take a write: {exc}") from exc

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._writing():
            self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # ---- records -------------------------------------------------------------------------

    def insert(self, row: dict[str, Any], idempotency_key: str | None) -> None:
        """A new record and its idempotency key, in one transaction."""
        with self._writing(), self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute(
                "INSERT INTO sandboxes (id, tenant, status, created_at, ended_at, data) VALUES (?, ?, ?, ?, ?, ?)",
                (row["id"], row["tenant"], row["status"], row["created_at"], row.get("ended_at"), json.dumps(row)),
            )
            if idempotency_key:
                self.conn.execute(
                    "INSERT OR REPLACE INTO idempotency (tenant, key, sandbox_id) VALUES (?, ?, ?)",
                    (row["tenant"], idempotency_key, row["id"]),
                )

    def update(self, row: dict[str, Any]) -> None:
        with self._writing():
            self.conn.execute(
                "UPDATE sandboxes SET status = ?, ended_at = ?, data = ? WHERE id = ?",
                (row["status"], row.get("ended_at"), json.dumps(row), row["id"]),
            )

    def touch_many(self, rows: list[tuple[float, str]]) -> None:
        """(last_active, id) pairs: activity alone, without rewriting whole rows."""
        if rows:
            with self._writing(), self.conn:
                self.conn.execute("BEGIN")
                self.conn.executemany("UPDATE sandboxes SET last_active = ? WHERE id = ?", rows)

    def load(self) -> list[dict[str, Any]]:
        out = []
        for data, active in self.conn.execute("SELECT data, last_active FROM sandboxes ORDER BY created_at"):
            row = json.loads(data)
            if active is not None:
                row["last_active"] = max(active, row.get("last_active") or 0.0)
            out.append(row)
        return out

    def idempotency_keys(self) -> list[tuple[str, str, str]]:
        return list(self.conn.execute("SELECT tenant, key, sandbox_id FROM idempotency"))

    def forget(self, ids: list[str]) -> None:
        with self._writing(), self.conn:
            self.conn.execute("BEGIN")
            for sid in ids:
                self.conn.execute("DELETE FROM sandboxes WHERE id = ?", (sid,))
                self.conn.execute("DELETE FROM idempotency WHERE sandbox_id = ?", (sid,))
                self.conn.execute("DELETE FROM events WHERE sandbox_id = ?", (sid,))

    # ---- events --------------------------------------------------------------------------

    def add_events(self, rows: list[tuple[str, str]]) -> None:
        if rows:
            with self._writing(), self.conn:
                self.conn.execute("BEGIN")
                self.conn.executemany("INSERT INTO events (sandbox_id, line) VALUES (?, ?)", rows)

    def trim_events(self, sandbox_id: str, keep: int) -> None:
        """Keep only the newest `keep` lines of a sandbox's event log."""
        with self._writing():
            self.conn.execute(
                "DELETE FROM events WHERE sandbox_id = ? AND rowid < (SELECT MIN(rowid) FROM "
                "(SELECT rowid FROM events WHERE sandbox_id = ? ORDER BY rowid DESC LIMIT ?))",
                (sandbox_id, sandbox_id, keep),
            )

    def events(self, sandbox_id: str, limit: int) -> list[str]:
        rows = self.conn.execute(
            "SELECT line FROM events WHERE sandbox_id = ? ORDER BY rowid DESC LIMIT ?", (sandbox_id, limit)
        ).fetchall()
        return [line for (line,) in reversed(rows)]
