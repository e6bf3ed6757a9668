"""`Store`: the PostgreSQL side of the shared state, over psycopg 3's AsyncConnection.

The only module that imports the driver; `toolatlas.store.replica` imports it only when a
`[store] url` is configured, so a daemon without one never loads psycopg. Two connections:
one for queries (one operation at a time, under a lock), one that LISTENs. Every failure
of the database (refused, dropped, timed out) becomes `StoreDown`, whose message names the
operation; the replica then reconnects and its writes wait in the on-disk buffer.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import psycopg
from psycopg.types.json import Jsonb

from toolatlas.errors import ToolatlasError
from toolatlas.redact import Redactor
from toolatlas.store.ports import FEEDBACK, FEEDBACK_FORGET, Change
from toolatlas.store.schema import CHANNEL, MIGRATION_LOCK, SCHEMA_TABLE, WRITE_LOCK, pending

log = logging.getLogger(__name__)

# Seconds any one statement may take before the connection counts as down.
OP_TIMEOUT_S = 10.0
# Unix time near PostgreSQL's first timestamptz (4713 BC): to_timestamp of an earlier time fails.
OLDEST_TIMESTAMP = -2.0e11
# Events deleted per statement when pruning.
PRUNE_BATCH = 5000
# Notifications sent per write batch at most; more keys than this send one "catch up" instead.
NOTIFY_MAX = 32


class StoreDown(ToolatlasError):
    """The shared store cannot be reached or failed a statement (the message says which)."""


class StoreRejected(ToolatlasError):
    """The database refused a write's content (e.g. a NUL character in JSON text); the
    connection is fine. The replica drops that record (logged, counted) instead of retrying
    it forever."""


class Store:
    """Connections to the shared database; see the module docstring."""

    def __init__(self, url: str, *, origin: str, connect_timeout: float, redactor: Redactor) -> None:
        self._url = url
        self.origin = origin
        self._connect_timeout = connect_timeout
        self._redact = redactor
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._listen: psycopg.AsyncConnection[Any] | None = None
        self._lock = anyio.Lock()
        self.schema_version = 0  # the database's, once migrate() ran (maybe newer than schema.LATEST)

    def __repr__(self) -> str:
        return f"<Store origin={self.origin} connected={self._conn is not None}>"

    def _down(self, operation: str, exc: BaseException | str) -> StoreDown:
        return StoreDown(self._redact(f"shared store: {operation} failed: {_one_line(exc)}".strip()))

    async def connect(self) -> None:
        """Open both connections (autocommit); StoreDown when the database does not answer."""
        try:
            with anyio.fail_after(self._connect_timeout + 1):
                self._conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, connect_timeout=max(1, int(self._connect_timeout)),
                    application_name=f"toolatlas {self.origin}"[:63])
                self._listen = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, connect_timeout=max(1, int(self._connect_timeout)))
                await self._listen.execute(f"LISTEN {CHANNEL}")
        except TimeoutError:
            await self.close()
            raise self._down("connect", f"the database did not answer within {self._connect_timeout + 1:g} s") from None
        except (psycopg.Error, OSError) as exc:
            await self.close()
            raise self._down("connect", exc) from None

    async def close(self) -> None:
        with anyio.move_on_after(2, shield=True):
            for conn in (self._conn, self._listen):
                if conn is not None:
                    try:
                        await conn.close()
                    except (psycopg.Error, OSError):
                        pass
        self._conn = self._listen = None

    async def _run(self, operation: str, fn: Any, *args: Any) -> Any:
        """`await fn(conn, *args)` under the lock and OP_TIMEOUT_S; StoreDown on failure, also
        when the connection was closed while this waited for the lock."""
        try:
            async with self._lock:
                if self._conn is None:
                    raise StoreDown(f"shared store: {operation} failed: not connected")
                with anyio.fail_after(OP_TIMEOUT_S):
                    return await fn(self._conn, *args)
        except psycopg.DataError as exc:  # this write's content, not the link: retrying cannot help
            raise StoreRejected(self._redact(f"shared store: {operation} refused the data: {_one_line(exc)}")) from None
        except TimeoutError:  # a hung host or a black-holed network: said, not an empty message
            raise self._down(operation, f"the database did not answer within {OP_TIMEOUT_S:g} s") from None
        except (psycopg.Error, OSError) as exc:
            raise self._down(operation, exc) from None

    # -- schema -------------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply the migrations this database lacks, under the advisory lock (a replica
        starting at the same time waits, then finds nothing to do). The versions applied."""
        return list(await self._run("migrate", self._migrate))

    async def _migrate(self, conn: psycopg.AsyncConnection[Any]) -> list[int]:
        await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            await conn.execute(SCHEMA_TABLE)
            cur = await conn.execute("SELECT version FROM toolatlas_schema")
            applied = {int(r[0]) for r in await cur.fetchall()}
            done: list[int] = []
            for version, name, statements in pending(applied):
                async with conn.transaction():
                    for sql in statements:
                        await conn.execute(sql)
                    await conn.execute("INSERT INTO toolatlas_schema (version, name, applied_by) VALUES (%s, %s, %s)",
                                       (version, name, self.origin))
                done.append(version)
                log.info("store.migrated version=%d (%s)", version, name)
            self.schema_version = max(applied | set(done), default=0)
            return done
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    # -- writes -------------------------------------------------------------------------------

    async def write(self, records: Sequence[dict[str, Any]]) -> None:
        """Apply buffered records (outbox lines) in one transaction, idempotently: an event
        whose `idem` is there already is skipped; a state value older than the stored one
        (or the same write again) changes nothing. Then NOTIFY the other replicas."""
        await self._run("write", self._write, records)

    async def _write(self, conn: psycopg.AsyncConnection[Any], records: Sequence[dict[str, Any]]) -> None:
        keys: dict[tuple[str, str, str], None] = {}
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))  # commit order = id order
            for r in records:
                if r["t"] == "event":
                    # A usage event written before a `learning forget` of its tool (buffered
                    # while the database was down) stays out: it holds a user's query.
                    await conn.execute(
                        "INSERT INTO toolatlas_events (kind, key, body, origin, idem, written_at) "
                        "SELECT %(kind)s, %(key)s, %(body)s, %(origin)s, %(idem)s, to_timestamp(%(at)s) "
                        "WHERE %(kind)s <> %(feedback)s OR NOT EXISTS (SELECT 1 FROM toolatlas_events "
                        "WHERE kind = %(forget)s AND key IN (%(key)s, '*') AND written_at >= to_timestamp(%(at)s)) "
                        "ON CONFLICT (idem) DO NOTHING",
                        {**r, "body": Jsonb(r["body"]), "feedback": FEEDBACK, "forget": FEEDBACK_FORGET})
                else:
                    await conn.execute(
                        "INSERT INTO toolatlas_state (kind, key, body, origin, idem, written_at) "
                        "VALUES (%s, %s, %s, %s, %s, to_timestamp(%s)) ON CONFLICT (kind, key) DO UPDATE "
                        "SET body = EXCLUDED.body, origin = EXCLUDED.origin, idem = EXCLUDED.idem, "
                        "written_at = EXCLUDED.written_at, seq = nextval('toolatlas_state_seq') "
                        "WHERE toolatlas_state.idem <> EXCLUDED.idem AND toolatlas_state.written_at <= EXCLUDED.written_at",
                        (r["kind"], r["key"], Jsonb(r["body"]), r["origin"], r["idem"], r["at"]))
                keys[(r["t"], r["kind"], r["key"])] = None
            payloads = [{"origin": self.origin, "table": t, "kind": k, "key": key} for t, k, key in keys]
            if len(payloads) > NOTIFY_MAX:
                payloads = [{"origin": self.origin, "table": "*", "kind": "*", "key": "*"}]
            for p in payloads:
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps(p)[:7000]))

    async def forget_feedback(self, tool: str | None, until: float) -> int:
        """Delete the shared usage events of `tool` (None: of every tool) written up to
        `until`, and log a FEEDBACK_FORGET event so each replica deletes its own copies (and
        drops any that reach it late); one transaction. How many shared events were deleted."""
        async def q(conn: psycopg.AsyncConnection[Any]) -> int:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                cur = await conn.execute(
                    "DELETE FROM toolatlas_events WHERE kind = %s AND (%s::text IS NULL OR key = %s) "
                    "AND written_at <= to_timestamp(%s)", (FEEDBACK, tool, tool, until))
                await conn.execute(
                    "INSERT INTO toolatlas_events (kind, key, body, origin, idem, written_at) "
                    "VALUES (%s, %s, %s, %s, %s, to_timestamp(%s))",
                    (FEEDBACK_FORGET, tool or "*", Jsonb({"tool": tool, "until": until}), self.origin,
                     uuid.uuid4().hex, until))
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps(
                    {"origin": self.origin, "table": "events", "kind": FEEDBACK_FORGET, "key": tool or "*"})))
                return int(cur.rowcount)
        return int(await self._run("forget usage events", q))

    async def prune_events(self, kind: str, before: float) -> int:
        """Delete the events of `kind` written before `before` (Unix time); how many. A time
        before PostgreSQL's first timestamp (a retention of millions of days) deletes nothing."""
        if before < OLDEST_TIMESTAMP:
            return 0

        # In batches, each its own statement: one DELETE of months of events (the first prune
        # after an upgrade, a lowered retention) outlasts OP_TIMEOUT_S, is rolled back, cuts the
        # link and is tried again, forever; batches finish, and other operations take turns.
        # Each batch is a range of ids after the last one's (an index range scan; the index still
        # lists the rows just deleted, and `id IN (batch)` is planned as a scan of the table).
        async def q(conn: psycopg.AsyncConnection[Any], after: int) -> list[int]:
            old = "kind = %(kind)s AND written_at < to_timestamp(%(before)s) AND id > %(after)s"
            cur = await conn.execute(
                f"DELETE FROM toolatlas_events WHERE {old} AND id <= (SELECT max(id) FROM (SELECT id FROM "
                f"toolatlas_events WHERE {old} ORDER BY id LIMIT %(n)s) AS batch) RETURNING id",
                {"kind": kind, "before": before, "after": after, "n": PRUNE_BATCH})
            return [int(r[0]) for r in await cur.fetchall()]
        total, after = 0, 0
        while ids := list(await self._run(f"prune {kind} events", q, after)):
            total, after = total + len(ids), max(ids)
            if len(ids) < PRUNE_BATCH:
                break
        return total

    # -- reads --------------------------------------------------------------------------------

    # What `_changes` reads per table: (table name, its sequence column).
    _TABLES = {"events": ("toolatlas_events", "id"), "state": ("toolatlas_state", "seq")}

    async def events_after(self, last_id: int, limit: int = 1000, *, kinds: Sequence[str] | None = None) -> list[Change]:
        """Events with an id above `last_id` (of `kinds` only, when given), in id order."""
        return await self._changes("events", last_id, limit, kinds)

    async def state_after(self, last_seq: int, limit: int = 1000) -> list[Change]:
        """State values written (applied) after sequence number `last_seq`, in that order."""
        return await self._changes("state", last_seq, limit)

    async def _changes(self, table: str, after: int, limit: int, kinds: Sequence[str] | None = None) -> list[Change]:
        name, col = self._TABLES[table]
        only = "" if kinds is None else "AND kind = ANY(%(kinds)s) "

        async def q(conn: psycopg.AsyncConnection[Any]) -> list[Change]:
            cur = await conn.execute(f"SELECT {col}, kind, key, body, origin FROM {name} WHERE {col} > %(after)s "
                                     f"{only}ORDER BY {col} LIMIT %(limit)s",
                                     {"after": after, "limit": limit, "kinds": list(kinds or ())})
            return [Change(table, r[1], r[2], r[3], r[4], int(r[0])) for r in await cur.fetchall()]
        return list(await self._run(f"read {table}", q))

    async def last_event_id(self) -> int:
        async def q(conn: psycopg.AsyncConnection[Any]) -> int:
            cur = await conn.execute("SELECT coalesce(max(id), 0) FROM toolatlas_events")
            row = await cur.fetchone()
            return int(row[0]) if row else 0
        return int(await self._run("read events", q))

    async def latest_events(self, kind: str) -> list[Change]:
        """The newest event of `kind` per key (what a replica starting up compares against)."""
        async def q(conn: psycopg.AsyncConnection[Any]) -> list[Change]:
            cur = await conn.execute("SELECT DISTINCT ON (key) id, kind, key, body, origin FROM toolatlas_events "
                                     "WHERE kind = %s ORDER BY key, id DESC", (kind,))
            return [Change("events", r[1], r[2], r[3], r[4], int(r[0])) for r in await cur.fetchall()]
        return list(await self._run("read events", q))

    async def get_vectors(self, space: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        async def q(conn: psycopg.AsyncConnection[Any]) -> dict[bytes, bytes]:
            # binary results: the vectors come as bytes, not as hex text to decode
            cur = await conn.execute("SELECT key, vec FROM toolatlas_embeddings WHERE space = %s AND key = ANY(%s)",
                                     (space, list(keys)), binary=True)
            return {bytes(r[0]): bytes(r[1]) for r in await cur.fetchall()}
        return dict(await self._run("read embeddings", q))

    async def put_vectors(self, space: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        async def q(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.cursor() as cur:
                await cur.executemany("INSERT INTO toolatlas_embeddings (space, key, vec) VALUES (%s, %s, %s) "
                                      "ON CONFLICT (space, key) DO NOTHING", [(space, k, v) for k, v in items])
        await self._run("write embeddings", q)

    async def notifications(self) -> AsyncIterator[dict[str, Any]]:
        """The payloads NOTIFY delivers, as they come; StoreDown when the connection drops."""
        if self._listen is None:
            raise StoreDown("shared store: listen failed: not connected")
        try:
            async for note in self._listen.notifies():
                try:
                    payload = json.loads(note.payload)
                except ValueError:
                    continue
                if isinstance(payload, dict):
                    yield payload
        except (psycopg.Error, OSError) as exc:
            raise self._down("listen", exc) from None
        raise StoreDown("shared store: listen failed: the connection closed")


def _one_line(exc: BaseException | str) -> str:
    """libpq's message on one line: it may span several (a hint after a tab, one line per host
    tried), which a status field, a log line or a CLI's error must not."""
    return " ".join(str(exc).split())


__all__ = ["Store", "StoreDown", "StoreRejected"]
