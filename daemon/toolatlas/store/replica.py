"""`Replica`: this daemon's link to the shared store, as a long-lived service.

It satisfies `ports.Shared`. Writes go to the on-disk buffer (outbox.py) and a sender task
moves them to the database; a listener hears NOTIFY and a catch-up task reads what other
replicas wrote since the last read (every `catchup_interval` seconds, and at once on a
notification), handing each change to the subscribers of its kind. While the database is
down the daemon serves from local state: writes wait in the buffer, reads return nothing,
`status()` says so, and a reconnect every `retry_interval` seconds resumes both where they
stopped (the cursors are kept, so nothing written meanwhile is missed). Audit records wait in
their own spool (audit.py: written on the search and call paths, so cheaper than the outbox)
and go out with the sender's next round, about once a second. The replica's name in
the store and its event cursor are kept in `state_dir/store`, so a restarted replica neither
takes its own earlier writes for another replica's nor misses what the others wrote while it
was down; a new replica reads from the newest event on.

psycopg is imported only here, when the service first connects (`client.py`).
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc

from toolatlas.config import StoreSection
from toolatlas.paths import read_regular, write_atomic
from toolatlas.redact import Redactor
from toolatlas.store.audit import AuditSpool
from toolatlas.store.outbox import Buffer, Outbox
from toolatlas.store.ports import Change, Handler

if TYPE_CHECKING:
    from toolatlas.store.client import Store

log = logging.getLogger(__name__)
T = TypeVar("T")

FLUSH_BATCH = 500  # buffered records per database transaction
READ_BATCH = 1000  # changes per catch-up query
# Embedding vectors waiting for the database (in memory: any replica can recompute them).
VECTORS_PENDING_MAX = 100_000
VECTOR_BATCH = 500
# Seconds the daemon's start waits for the store's first connect (connect_timeout may be longer).
FIRST_ATTEMPT_WAIT_S = 2.0


class Replica:
    """This replica's side of the shared store; see the module docstring."""

    def __init__(self, section: StoreSection, state_dir: str, *, redactor: Redactor | None = None) -> None:
        self.cfg = section
        folder = Path(state_dir) / "store"
        self.outbox = Outbox(folder, section.buffer_max_bytes)
        self.origin = _stable_origin(folder / "origin")  # kept in state_dir, as the event cursor
        # The audit spool, once audit records are shared (or some from an earlier run wait there).
        self.audit = AuditSpool(folder / "audit", section.buffer_max_bytes, self.origin) \
            if (folder / "audit").is_dir() else None
        self._cursor_file = folder / "events.cursor"
        self._redact = redactor or Redactor()
        self._handlers: dict[str, list[Handler]] = defaultdict(list)
        self._store: Store | None = None
        self.connected = False
        self.error: str | None = None
        self.since = time.time()
        self.schema_version = 0
        self.counts = dict.fromkeys(
            ("sent", "rejected", "received", "reconnects", "vectors_fetched", "vectors_stored"), 0)
        self._wake_flush = anyio.Event()
        self._wake_catchup = anyio.Event()
        self._event_cursor: int | None = _read_cursor(self._cursor_file)  # None: new, start at the newest
        self._state_cursor = 0  # state: every value, once, from the start
        self._vectors: dict[tuple[str, bytes], bytes] = {}
        self.up = anyio.Event()  # set once connected the first time

    def __repr__(self) -> str:
        return f"<Replica {self.origin} connected={self.connected} buffered={self.outbox.pending_count}>"

    async def append(self, kind: str, key: str, body: dict[str, Any]) -> None:
        await self._buffer("event", kind, key, body)

    async def put(self, kind: str, key: str, body: dict[str, Any], *, at: float | None = None) -> None:
        await self._buffer("state", kind, key, body, at)

    def subscribe(self, kind: str, handler: Handler) -> None:
        self._handlers[kind].append(handler)

    def audit_sink(self) -> AuditSpool:
        """Where this replica's audit records go to be shared (events.Events.shared_audit)."""
        if self.audit is None:
            self.audit = AuditSpool(self.outbox.dir / "audit", self.cfg.buffer_max_bytes, self.origin)
        return self.audit

    async def flush(self, timeout: float) -> None:
        """Send what is buffered now, for up to `timeout` seconds (the daemon is stopping);
        what is left goes at the next start."""
        with anyio.move_on_after(timeout):
            while self.connected and self.status()["buffered"]:
                self._wake_flush.set()
                await anyio.sleep(0.02)

    async def _buffer(self, table: str, kind: str, key: str, body: dict[str, Any], at: float | None = None) -> None:
        rec = {"t": table, "kind": kind, "key": key, "body": body, "origin": self.origin,
               "idem": uuid.uuid4().hex, "at": time.time() if at is None else at}
        await anyio.to_thread.run_sync(self.outbox.append, [rec])
        self._wake_flush.set()

    async def _if_up(self, op: Callable[[Store], Awaitable[T]], default: T) -> T:
        """`await op(store)`, or `default` while the store is down (or goes down meanwhile), or
        when the database refuses the operation (logged: the daemon serves on)."""
        from toolatlas.store.client import StoreDown, StoreRejected

        try:
            return default if self._store is None else await op(self._store)
        except (StoreDown, StoreRejected) as exc:
            if isinstance(exc, StoreRejected):
                log.warning("%s", exc)
            return default

    async def latest(self, kind: str) -> list[Change]:
        """The newest event of `kind` per key; [] while the store is down."""
        return await self._if_up(lambda store: store.latest_events(kind), list[Change]())

    async def prune(self, kind: str, before: float) -> int | None:
        """Delete the shared events of `kind` written before `before`; how many, or None while
        the store is down (the caller tries again later)."""
        return await self._if_up(lambda store: store.prune_events(kind, before), None)

    async def get_vectors(self, space: str, keys: list[bytes]) -> dict[bytes, bytes]:
        """Shared embeddings of `keys` in `space`; {} while the store is down."""
        got = await self._if_up(lambda store: store.get_vectors(space, keys), dict[bytes, bytes]()) if keys else {}
        self.counts["vectors_fetched"] += len(got)
        return got

    def queue_vectors(self, space: str, items: list[tuple[bytes, bytes]]) -> None:
        """Embeddings this replica computed, to be shared (sent by the sender task)."""
        for key, vec in items:
            if len(self._vectors) >= VECTORS_PENDING_MAX:
                break
            self._vectors[(space, key)] = vec
        self._wake_flush.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect (started() after the first attempt, so a reachable store is there from the first
        catalog on, or after FIRST_ATTEMPT_WAIT_S: a host that does not answer does not hold the
        start for connect_timeout), then keep the sender, listener and catch-up running,
        reconnecting every `retry_interval` seconds while the database is down. Until cancelled."""
        tried = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._link, tried)
            with anyio.move_on_after(FIRST_ATTEMPT_WAIT_S):
                await tried.wait()
            if not tried.is_set():  # `toolatlas status` says so meanwhile, not "UNREACHABLE (None)"
                self.error = "shared store: connect: no answer yet, still waiting for the database"
            task_status.started()

    async def _link(self, tried: anyio.Event) -> None:
        store = await self._attempt()
        tried.set()
        try:
            while True:
                if store is None:
                    await anyio.sleep(self.cfg.retry_interval)
                    store = await self._attempt()
                    continue
                await self._serve(store)
                store = None
        finally:
            if self._store is not None:
                await self._store.close()

    async def _attempt(self) -> Store | None:
        from toolatlas.store.client import Store, StoreDown

        store = Store(self.cfg.url, origin=self.origin, connect_timeout=self.cfg.connect_timeout,
                      redactor=self._redact)
        try:
            await store.connect()
            applied = await store.migrate()
            self._event_cursor = _starting_cursor(self._event_cursor, await store.last_event_id(), self._cursor_file)
        except StoreDown as exc:
            await store.close()
            self._mark_down(str(exc))
            return None
        self.schema_version = store.schema_version
        _say_schema(store.schema_version, applied)
        if self.up.is_set():
            self.counts["reconnects"] += 1
        self._store = store
        self.connected, self.error, self.since = True, None, time.time()
        log.info("store.connected as %s (%d buffered writes to send)", self.origin, self.outbox.pending_count)
        self.up.set()
        self._wake_catchup.set()
        return store

    def _mark_down(self, why: str) -> None:
        if self.connected or self.error != why:
            log.warning("store.unreachable: %s; serving from local state, writes buffered on disk, "
                        "retrying every %.1f s", why, self.cfg.retry_interval)
        if self.connected:
            self.since = time.time()
        self.connected, self.error = False, why

    async def _serve(self, store: Store) -> None:
        from toolatlas.store.client import StoreDown

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._listen, store)
                tg.start_soon(self._send, store)
                tg.start_soon(self._catch_up_loop, store)
        except* StoreDown as group:
            self._mark_down(str(group.exceptions[0]))
        except* Exception as group:  # a bug or a full disk: log it, keep serving, retry
            log.error("store.link_failed; reconnecting", exc_info=group.exceptions[0])
            self._mark_down(f"shared store: {type(group.exceptions[0]).__name__}: {group.exceptions[0]}")
        finally:
            self._store = None
            await store.close()

    async def _send(self, store: Store) -> None:
        while True:
            if await self._send_from(store, self.outbox) or (self.audit and await self._send_from(store, self.audit)):
                continue
            if self._vectors:
                self.counts["vectors_stored"] += await _send_vectors(store, self._vectors)
                continue
            with anyio.move_on_after(1.0):
                await self._wake_flush.wait()
            self._wake_flush = anyio.Event()

    async def _send_from(self, store: Store, buffer: Buffer) -> bool:
        """Commit the next batch of `buffer` and mark it done there; False when it is empty."""
        records, position = await anyio.to_thread.run_sync(buffer.peek, FLUSH_BATCH)
        if not records:
            return False
        self.counts["rejected"] += await _write(store, records)
        await anyio.to_thread.run_sync(buffer.mark_done, position, len(records))
        self.counts["sent"] += len(records)
        return True

    async def _listen(self, store: Store) -> None:
        async for payload in store.notifications():  # another replica's audit records wake no one
            if payload.get("origin") != self.origin and (payload.get("kind") in self._handlers
                                                         or payload.get("table") != "events"):
                self._wake_catchup.set()

    async def _catch_up_loop(self, store: Store) -> None:
        while True:
            await self._catch_up(store)
            with anyio.move_on_after(self.cfg.catchup_interval):
                await self._wake_catchup.wait()
            self._wake_catchup = anyio.Event()

    async def _catch_up(self, store: Store) -> None:
        """Hand every change since the cursors to its subscribers, in order (events only of
        the kinds subscribed to: not every replica's audit records)."""
        while kinds := sorted(self._handlers):
            events = await store.events_after(self._event_cursor or 0, READ_BATCH, kinds=kinds)
            for change in events:
                self._event_cursor = change.seq
                await self._dispatch(change)
            if events:
                await anyio.to_thread.run_sync(_write_cursor, self._cursor_file, events[-1].seq)
            if len(events) < READ_BATCH:
                break
        while True:
            states = await store.state_after(self._state_cursor, READ_BATCH)
            for change in states:
                self._state_cursor = change.seq
                await self._dispatch(change)
            if len(states) < READ_BATCH:
                break

    async def _dispatch(self, change: Change) -> None:
        if change.origin == self.origin:
            return
        self.counts["received"] += 1
        for handler in self._handlers.get(change.kind, ()):
            try:
                await handler(change)
            except Exception:  # one subscriber's bug must not stop the others or the store
                log.exception("store.subscriber_failed kind=%s key=%s", change.kind, change.key)

    def status(self) -> dict[str, Any]:
        """catalog_status's `store` section (no URL: it may hold a password)."""
        audit = self.audit
        audit_buffered = audit.pending_count if audit else 0
        return {
            "configured": True, "connected": self.connected, "since": round(self.since, 3), "error": self.error,
            "replica": self.origin, "schema_version": self.schema_version,
            "buffered": self.outbox.pending_count + audit_buffered,
            "buffered_bytes": self.outbox.pending_bytes + (audit.pending_bytes if audit else 0),
            "buffer_max_bytes": self.outbox.max_bytes, "refused": self.outbox.refused + (audit.refused if audit else 0),
            "audit_buffered": audit_buffered, "vectors_pending": len(self._vectors), **self.counts,
        }


async def _write(store: Store, records: list[dict[str, Any]]) -> int:
    """Commit `records`; one whose content the database refuses is dropped (logged) so it
    cannot hold back every write behind it. How many were dropped."""
    from toolatlas.store.client import StoreRejected

    try:
        await store.write(records)
        return 0
    except StoreRejected:
        pass
    rejected = 0
    for rec in records:
        try:
            await store.write([rec])
        except StoreRejected as exc:
            rejected += 1
            log.error("store.write_rejected kind=%s key=%s: %s; dropped", rec.get("kind"), rec.get("key"), exc)
    return rejected


async def _send_vectors(store: Store, pending: dict[tuple[str, bytes], bytes]) -> int:
    """Store a batch of the `pending` embeddings (removed from it); how many."""
    batch = list(pending.items())[:VECTOR_BATCH]
    by_space: dict[str, list[tuple[bytes, bytes]]] = defaultdict(list)
    for (space, key), vec in batch:
        by_space[space].append((key, vec))
    for space, items in by_space.items():
        await store.put_vectors(space, items)
    for k, _ in batch:
        pending.pop(k, None)
    return len(batch)


def _say_schema(version: int, applied: list[int]) -> None:
    """Log a migration this replica applied, and a schema newer than it knows (a replica not
    upgraded yet in a rolling upgrade: it keeps working on the tables it knows)."""
    from toolatlas.store.schema import LATEST

    if applied:
        log.info("store.schema migrated to version %d", version)
    if version > LATEST:
        log.warning("store: the database's schema is at version %d, newer than this toolatlas knows (%d); it works "
                    "on the tables it knows: upgrade toolatlas on this host", version, LATEST)


def _stable_origin(path: Path) -> str:
    """This state_dir's replica name (hostname:random), made once and kept in `path`."""
    try:
        name = read_regular(path).decode().strip()  # a FIFO there is refused, not waited on
        if name:
            return name
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8 text (a corrupted file)
        log.warning("store: cannot read %s (%s); using a new replica name", path, exc)
    name = f"{socket.gethostname()}:{secrets.token_hex(6)}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, name.encode(), 0o600)
    except OSError as exc:
        log.warning("store: cannot keep the replica name in %s (%s)", path, exc)
    return name


def _read_cursor(path: Path) -> int | None:
    try:
        return int(read_regular(path).decode().strip())  # a FIFO there is refused, not waited on
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("store: the event cursor %s is unreadable (%s); reading from the newest event", path, exc)
        return None


def _starting_cursor(cursor: int | None, last: int, path: Path) -> int:
    """The event id a connecting replica reads after: its cursor; the database's newest (`last`)
    for a new replica, and when the database's events end before the cursor (restored from a
    backup, or a new database: reading after the cursor would skip its events for long)."""
    if cursor is not None and cursor <= last:
        return cursor
    if cursor is not None:
        log.warning("store: the database's events end at id %d, before this replica's cursor %d (a restored or "
                    "replaced database); reading its events from there", last, cursor)
    _write_cursor(path, last)
    return last


def _write_cursor(path: Path, seq: int) -> None:
    try:
        write_atomic(path, str(seq).encode(), 0o600)
    except OSError as exc:  # read again after a restart: handlers are idempotent or level-triggered
        log.warning("store: cannot keep the event cursor in %s (%s)", path, exc)

__all__ = ["Replica"]
