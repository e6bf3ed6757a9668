"""The usage store: implicit feedback events (a search, then a successful call of one of its
results), kept in `state_dir` across restarts.

`UsageStore` is the port the rest of the daemon speaks; `SqliteUsageStore` is the default
adapter (one file, `learning.sqlite3`, mode 0600, WAL with synchronous=NORMAL: a committed
event survives a SIGKILL of the daemon, a power loss may take the last commits, and the file
is never left corrupt). Another adapter (a shared PostgreSQL, issue 21) only has to satisfy
the same Protocol.

An event carries the query text (the ranker needs it: past queries are added to the tool's
lexical document), so the store holds query text even when `log_queries` is off; `toolatlas
learning reset` deletes it. The query's vector is stored with the name of the vector space
it lives in, so a restart re-embeds only events whose vector is missing or from another model.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

FILENAME = "learning.sqlite3"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UsageEvent:
    """One executed search result. `at` is a Unix time; `vector` (float32, normalised) may
    be None until the query is embedded; `space` names the model it came from."""

    query: str
    tool: str
    principal: str
    at: float
    index_version: int = 0
    vector: np.ndarray | None = None
    space: str | None = None
    id: int = 0  # assigned by the store


class UsageStore(Protocol):
    """Where usage events live. Methods block (call them from a worker thread); each is
    atomic: a failure leaves the store as it was."""

    def add(self, events: Sequence[UsageEvent]) -> list[int]:
        """Append events; their ids, in order."""
        ...

    def events(self, since: float = 0.0) -> list[UsageEvent]:
        """Every event at or after `since` (Unix time), oldest first."""
        ...

    def set_vectors(self, ids: Sequence[int], vectors: np.ndarray, space: str) -> None:
        """Store the query vectors of events `ids` (rows of `vectors`)."""
        ...

    def forget_tool(self, tool: str, until: float = math.inf) -> int:
        """Delete every event of `tool` (those at or before `until`, Unix time); how many."""
        ...

    def prune(self, before: float) -> int:
        """Delete events older than `before` (Unix time); how many."""
        ...

    def trim(self, keep: int) -> int:
        """Delete all but the `keep` newest events (the highest ids); how many."""
        ...

    def reset(self) -> int:
        """Delete every event; how many."""
        ...

    def changed_elsewhere(self) -> bool:
        """Whether another writer (`toolatlas learning forget|reset` while the daemon runs)
        changed the store since the last call: the daemon then reloads its events. Called
        every second: a store may check its storage here (the SQLite one: see
        `_renew_if_deleted`)."""
        ...

    def close(self) -> None: ...


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back the transaction a failed write left open. SQLite has rolled it back itself
    after some errors (SQLITE_FULL: a full disk; SQLITE_IOERR): a ROLLBACK then would fail
    with "no transaction is active" and hide the error that says what is wrong."""
    if db.in_transaction:
        db.execute("ROLLBACK")


class SqliteUsageStore:
    """`UsageStore` over one SQLite file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Create it 0600 before sqlite opens it: the queries in it are the users' words.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)
        os.chmod(path, 0o600)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # A deleted event's query is overwritten, not left in the file's free space (the
        # default of many SQLite builds): forget, reset and retention promise the words gone.
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, query TEXT NOT NULL, tool TEXT NOT NULL,"
            " principal TEXT NOT NULL, at REAL NOT NULL, index_version INTEGER NOT NULL, vector BLOB, space TEXT)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS events_tool ON events(tool)")
        self._data_version = self._version()
        for suffix in ("-wal", "-shm"):  # sqlite creates these with the umask's mode
            side = Path(str(path) + suffix)
            if side.exists():
                os.chmod(side, 0o600)

    def _tx(self, sql: str, rows: Iterable[tuple[object, ...]] | None = None) -> int:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                if rows is None:
                    cur.execute(sql)
                else:
                    cur.executemany(sql, rows)
                n = cur.rowcount
                cur.execute("COMMIT")
            except BaseException:
                _rollback(self._db)
                raise
            return int(n)

    def add(self, events: Sequence[UsageEvent]) -> list[int]:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            ids: list[int] = []
            try:
                for e in events:
                    cur.execute(
                        "INSERT INTO events (query, tool, principal, at, index_version, vector, space)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (e.query, e.tool, e.principal, e.at, e.index_version, _blob(e.vector), e.space),
                    )
                    ids.append(int(cur.lastrowid or 0))
                cur.execute("COMMIT")
            except BaseException:
                _rollback(self._db)
                raise
            return ids

    def events(self, since: float = 0.0) -> list[UsageEvent]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, query, tool, principal, at, index_version, vector, space FROM events"
                " WHERE at >= ? ORDER BY id", (since,),
            ).fetchall()
        return [
            UsageEvent(query=q, tool=t, principal=p, at=at, index_version=v, vector=_vec(blob), space=space, id=i)
            for i, q, t, p, at, v, blob, space in rows
        ]

    def set_vectors(self, ids: Sequence[int], vectors: np.ndarray, space: str) -> None:
        self._tx("UPDATE events SET vector = ?, space = ? WHERE id = ?",
                 ((_blob(v), space, int(i)) for i, v in zip(ids, vectors)))

    def forget_tool(self, tool: str, until: float = math.inf) -> int:
        if until == math.inf:
            return self._delete("DELETE FROM events WHERE tool = ?", (tool,))
        return self._delete("DELETE FROM events WHERE tool = ? AND at <= ?", (tool, until))

    def prune(self, before: float) -> int:
        return self._delete("DELETE FROM events WHERE at < ?", (before,))

    def trim(self, keep: int) -> int:
        return self._delete("DELETE FROM events WHERE id <= (SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?)",
                            (keep,))

    def reset(self) -> int:
        return self._delete("DELETE FROM events", ())

    def _delete(self, sql: str, args: tuple[object, ...]) -> int:
        """Delete events, then copy the write-ahead log into the file and empty it: until then
        the log keeps the deleted events' pages, query text included, as they were before (a
        running daemon's log is only checkpointed, never emptied, so for as long as it runs)."""
        n = self._tx(sql, [args])
        if n:
            with self._lock:  # best effort: a reader holding the log open keeps it (the next delete empties it)
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return n

    def _version(self) -> int:
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def changed_elsewhere(self) -> bool:
        # data_version moves only when another connection commits
        with self._lock:
            renewed = self._renew_if_deleted()
            now = self._version()
        changed, self._data_version = renewed or now != self._data_version, now
        return changed

    def _renew_if_deleted(self) -> bool:
        """A store file deleted under the daemon (`rm` of it or of state_dir) is taken as a
        wipe, like `toolatlas learning reset`: the daemon goes on in a new empty file at the
        path (its next reload forgets the events) instead of filling the unlinked one, which
        would vanish at the next start. Never written back: the file holds users' words, and
        whoever deleted it meant them gone. (Closing the old connection first: closing it
        unlinks `path`-wal and -shm by name.) Whether it was renewed."""
        if os.path.exists(self.path):
            return False
        self._db.close()
        self._open()
        log.warning("learning: the usage store %s was deleted while the daemon ran; its events are forgotten "
                    "(as after `toolatlas learning reset`) and a new store is used", self.path)
        return True

    def close(self) -> None:
        with self._lock:
            self._db.close()


class MemoryUsageStore:
    """`UsageStore` in a list: `toolatlas eval --feedback` and benchmarks (nothing on disk)."""

    def __init__(self) -> None:
        self._events: list[UsageEvent] = []
        self._next = 1

    def add(self, events: Sequence[UsageEvent]) -> list[int]:
        ids = list(range(self._next, self._next + len(events)))
        self._next += len(events)
        self._events.extend(_with_id(e, i) for e, i in zip(events, ids))
        return ids

    def events(self, since: float = 0.0) -> list[UsageEvent]:
        return [e for e in self._events if e.at >= since]

    def set_vectors(self, ids: Sequence[int], vectors: np.ndarray, space: str) -> None:
        vec_of = {int(i): v for i, v in zip(ids, vectors)}
        self._events = [
            _with_id(e, e.id, vec_of[e.id], space) if e.id in vec_of else e for e in self._events
        ]

    def forget_tool(self, tool: str, until: float = math.inf) -> int:
        before = len(self._events)
        self._events = [e for e in self._events if e.tool != tool or e.at > until]
        return before - len(self._events)

    def prune(self, before: float) -> int:
        n = len(self._events)
        self._events = [e for e in self._events if e.at >= before]
        return n - len(self._events)

    def trim(self, keep: int) -> int:
        n = len(self._events)
        self._events = self._events[max(0, n - keep):]
        return n - len(self._events)

    def reset(self) -> int:
        n = len(self._events)
        self._events = []
        return n

    def changed_elsewhere(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _with_id(e: UsageEvent, i: int, vector: np.ndarray | None = None, space: str | None = None) -> UsageEvent:
    return UsageEvent(query=e.query, tool=e.tool, principal=e.principal, at=e.at, index_version=e.index_version,
                      vector=vector if vector is not None else e.vector, space=space or e.space, id=i)


def _blob(vec: np.ndarray | None) -> bytes | None:
    # float16 halves the store (16,893 events: 13 MB); cosine ranks barely move at 1e-3.
    return None if vec is None else np.asarray(vec, dtype=np.float16).tobytes()


def _vec(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.float16).astype(np.float32)


def forget_until(store: UsageStore, tool: str | None, until: float) -> int:
    """Delete the events of `tool` (None: of every tool) at or before `until`; how many."""
    return store.forget_tool(tool, until) if tool is not None else store.prune(math.nextafter(until, math.inf))


def open_store(state_dir: Path) -> SqliteUsageStore:
    """The daemon's usage store in `state_dir`."""
    return SqliteUsageStore(Path(state_dir) / FILENAME)


__all__ = ["FILENAME", "MemoryUsageStore", "SqliteUsageStore", "UsageEvent", "UsageStore", "forget_until", "open_store"]
