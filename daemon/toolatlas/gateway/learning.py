"""Implicit feedback: a `tool_search` followed, on the same connection (`Connection.conversation`)
and within the window, by a successful call of one of the tools it returned is a usage event; the
events feed the learned stage of the engine's ranker (retrieval/learned.py).

The event loop only notes searches and calls (dict operations); one worker task writes
events to the usage store (retrieval/usage.py, a port: SQLite in state_dir by default),
embeds their queries and publishes a new learned state, all in worker threads. An event is
handed to the store at once (a SIGKILL loses at most the events of the last moment, never
the store), and the learned state is republished at most every `PUBLISH_EVERY_S`.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Hashable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import numpy as np

from toolatlas import memory
from toolatlas.backoff import backoff_delay
from toolatlas.config import LearningSection
from toolatlas.gateway.ports import Connection
from toolatlas.metrics import Metrics
from toolatlas.names import split
from toolatlas.retrieval.engine import Engine, query_vectors
from toolatlas.retrieval.learned import LearningIndex
from toolatlas.retrieval.usage import FILENAME as USAGE_FILENAME
from toolatlas.retrieval.usage import UsageEvent, UsageStore, forget_until, open_store

log = logging.getLogger(__name__)

SEARCHES_PER_CONNECTION = 32  # recent searches remembered per connection
CONNECTIONS_TRACKED = 4096  # connections with recent searches (least recent forgotten first)
# A longer query is not learned from: its text would be held in the recent searches above
# (up to 32 x 4,096 of them) and in every usage event, in memory and in learning.sqlite3,
# and a query may be as long as max_message_bytes (4 MiB by default). No one asks for a
# tool in 8,000 characters; the embedder reads a query's first 256 tokens only.
MAX_QUERY_CHARS = 8192
PUBLISH_EVERY_S = 0.5  # at most this often a new learned state
POLL_S = 1.0  # how often the store is checked for changes by another writer (the CLI)
PRUNE_EVERY_S = 3600.0  # the store is pruned at least this often (and at start; see `_checks`)
# A learned state costs time in proportion to the events held (50,000 distinct queries of
# 100 principals: ~20 ms for the state, 0.2-0.4 s for the word sums of the lexical signal,
# ~10 ms for each of the nine principals' lexical indexes built at a publish): the next
# publish waits at least this many times the last one's cost, so publishing takes at most
# about a tenth of a core however busy the daemon is.
PUBLISH_COST_FACTOR = 10.0
EMBED_BATCH = 256
INGEST_WAIT_S = 30.0  # how long a shared event waits for room in the writer's queue
PREBUILT_PRINCIPALS = 8
# A store failing after it served this long starts the retry delays afresh (1 s); one that fails
# sooner (a full disk refuses the first write after each reopen) backs off further, up to 60 s.
HEALTHY_S = 60.0


class LearningService:
    """Notes searches and calls; its `run` task persists events and publishes the state."""

    def __init__(
        self, cfg: Callable[[], LearningSection], engine: Engine, state_dir: Path | None, *, metrics: Metrics,
        clock: Callable[[], float] = time.time, store: UsageStore | None = None,
    ) -> None:
        """`store`: the usage store (default: SQLite in `state_dir`; none without one)."""
        self._cfg = cfg
        self._engine = engine
        self._state_dir = state_dir
        self._metrics = metrics
        self._clock = clock
        self._store = store
        # connection (Connection.conversation) -> recent searches: (time, query, returned names, index version)
        self._recent: OrderedDict[Hashable, deque[tuple[float, str, frozenset[str], int]]] = OrderedDict()
        self._send, self._receive = anyio.create_memory_object_stream[UsageEvent](10_000)
        self._index = LearningIndex()
        self._lock = threading.Lock()  # the index: the writer's and the poller's threads
        self._pruned = -math.inf
        self._oldest = math.inf  # the time of the oldest event held (past retention: reload)
        self.error: str | None = None  # why the usage store failed (it is being opened again), else None
        self._unsaved: list[UsageEvent] = []  # a batch the store failed to take
        self._dirty = anyio.Event()  # events were added since the last learned state
        self._switched = anyio.Event()  # a reload may have switched `enabled`
        self._running = False  # the worker got past waiting for `enabled`
        # Hear each usage event recorded here (the shared store's wiring passes them on to the
        # other replicas, which `ingest` them).
        self.on_recorded: list[Callable[[UsageEvent], None]] = []

    @property
    def enabled(self) -> bool:
        return self._cfg().enabled and (self._store is not None or self._state_dir is not None)

    # -- the event loop's side: cheap, synchronous -----------------------------------------

    def searched(self, conn: Connection, query: str, names: list[str], version: int) -> None:
        """A search answered `names` to `conn`."""
        if not self.enabled or not names or not query.strip() or len(query) > MAX_QUERY_CHARS:
            return
        recent = self._recent.get(key := conn.conversation)
        if recent is None:
            recent = self._recent[key] = deque(maxlen=SEARCHES_PER_CONNECTION)
            while len(self._recent) > CONNECTIONS_TRACKED:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(key)
        recent.append((self._clock(), query, frozenset(names), version))

    def executed(self, conn: Connection, name: str, ok: bool) -> None:
        """`conn` called `name`; `ok`: no transport error and no `isError`. A call of a tool
        the connection's latest search returned within the window is a usage event (each
        search leads to at most one event per tool); a direct call records nothing."""
        recent = self._recent.get(conn.conversation)
        if not self.enabled or not recent:
            return
        now = self._clock()
        window = self._cfg().window
        for i in range(len(recent) - 1, -1, -1):
            at, query, names, version = recent[i]
            if name not in names:
                continue
            if now - at > window:
                self._metrics.count_feedback("outside_window")
                return
            if not ok:
                self._metrics.count_feedback("call_failed")
                return
            recent[i] = (at, query, names - {name}, version)
            event = UsageEvent(query=query, tool=name, principal=conn.principal, at=now, index_version=version)
            try:
                self._send.send_nowait(event)
            except anyio.WouldBlock:  # the writer is far behind: drop rather than block calls
                log.warning("learning: the usage writer is behind; an event for %s was dropped", name)
                self._metrics.count_feedback("dropped")
                return
            self._metrics.count_feedback("recorded")
            for hear in self.on_recorded:
                hear(event)
            return

    async def ingest(self, event: UsageEvent) -> bool:
        """Another replica's usage event, learned as one of ours (not passed on). Waits up to
        INGEST_WAIT_S for room; False when learning is off or none came (dropped, as ours)."""
        if not self.enabled:
            return False
        with anyio.move_on_after(INGEST_WAIT_S):
            await self._send.send(event)
            return True
        log.warning("learning: the usage writer is behind; a shared event for %s was dropped", event.tool)
        return False

    async def forget(self, tool: str | None, until: float) -> int:
        """Delete `tool`'s events (None: all) up to `until`, re-rank (store/wiring.py)."""
        return await _forget(self, tool, until)

    def status(self, scope: frozenset[str] | None = None) -> dict[str, Any]:
        """catalog_status's `learning` section, of the tools of `scope`'s servers (None: all)."""
        return status_section(self._engine, self.enabled, self.error, scope)

    def reconfigured(self) -> None:
        """After a reload: switched on, the waiting worker starts; off, learning stops as if so at start."""
        if self._running:
            self._engine.learning = self.enabled
        self._pruned = -math.inf  # the next poll prunes to the new retention_days and max_events
        self._switched.set()

    # -- the worker ------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Open the store, load its events, then persist new ones and publish states. A failing
        store never stops the daemon: the last learned state serves, `learning.error` says why,
        the store is opened again with backoff, events wait (the writer's queue, `_unsaved`). A
        file not an SQLite database, or corrupt, is moved aside and learning starts from none."""
        task_status.started()  # the store opens in the background: nothing else waits for it
        while not self.enabled:  # switched off: until a reload switches it on
            await self._switched.wait()
            self._switched = anyio.Event()
        self._engine.learning = self._running = True
        attempt = 0
        while True:
            failure: list[BaseException] = []
            opened = math.inf  # when the store last opened: a failure this soon after counts as one more in a row
            try:
                if self._store is None:
                    assert self._state_dir is not None
                    self._store = await anyio.to_thread.run_sync(open_store, self._state_dir)
                store = self._store
                await anyio.to_thread.run_sync(self._reload, store)
                if attempt:
                    log.info("learning: the usage store opened again after %d failed attempt(s)", attempt)
                self.error, opened = None, time.monotonic()
                async with anyio.create_task_group() as tg:
                    for loop in (self._write_loop, self._publish_loop, self._poll_loop):
                        tg.start_soon(_guarded, loop, store, failure, tg.cancel_scope)
            except (sqlite3.Error, OSError) as exc:
                failure.append(exc)
            finally:
                if not failure and self._store is not None:
                    with anyio.CancelScope(shield=True):  # cancelled: the daemon is stopping
                        await anyio.to_thread.run_sync(self._store.close)
            if not failure:
                return
            err = failure[0]
            attempt = 1 if time.monotonic() - opened > HEALTHY_S else attempt + 1
            delay = backoff_delay(attempt, base=1.0, cap=60.0)
            if self._state_dir is not None:  # a store of our own: closed, opened again
                failed, self._store = self._store, None
                await _close_quietly(failed)
                if _unreadable(err):
                    await anyio.to_thread.run_sync(_move_aside, self._state_dir / USAGE_FILENAME, err)
                    delay = 0.0 if attempt == 1 else delay
            self.error = f"usage store failed: {_describe(err)}; trying again in {delay:.0f} s"
            log.warning("learning: %s (the last learned state serves meanwhile)", self.error)
            await anyio.sleep(delay)

    def _reload(self, store: UsageStore) -> None:
        """Every event in the store (after pruning those past retention) into a fresh index;
        vectors of another model are re-embedded once one is loaded. Blocking."""
        _prune(store, self._cfg(), self._clock())
        self._pruned = time.monotonic()
        events = store.events()
        space = self._engine.space
        events = [e if e.space == space else _without_vector(e) for e in events]
        index = LearningIndex()
        index.add(events)
        with self._lock:
            self._index = index
            self._oldest = min((e.at for e in events), default=math.inf)
            self._publish()
        # tens of thousands of long-lived objects: out of the automatic collections' scans,
        # which otherwise land inside searches (see memory.settle_heap)
        memory.settle_heap()
        log.info("learning: %d usage events loaded", len(events))

    def _publish(self) -> None:
        state = self._index.state(self._clock())
        # the lexical documents as the usual principals see them, built here rather than in
        # the first search after the publish (the others are built on first use, memoised)
        for own in [-1, *list(state.principals.values())[:PREBUILT_PRINCIPALS]]:
            state.lexical(own)
        self._engine.set_learned(state)

    def _publish_locked(self) -> None:
        with self._lock:
            self._publish()

    async def _write_loop(self, store: UsageStore) -> None:
        """Persist events as they come (never waiting for a publish: that bounds what a crash
        loses), then tell the publisher."""
        while True:
            batch, self._unsaved = self._unsaved, []  # what a failed store did not take, first
            if not batch:
                batch = [await self._receive.receive()]
            while True:
                try:
                    batch.append(self._receive.receive_nowait())
                except anyio.WouldBlock:
                    break
            await anyio.to_thread.run_sync(self._persist, store, batch)
            self._dirty.set()

    async def _publish_loop(self, store: UsageStore) -> None:
        """Publish a new learned state when events were added, then rest `publish_rest`."""
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            began = time.monotonic()
            await anyio.to_thread.run_sync(self._publish_locked)
            await anyio.sleep(publish_rest(time.monotonic() - began))

    def _persist(self, store: UsageStore, batch: list[UsageEvent]) -> None:
        """Store the events, then embed their queries (the store first: a slow model must
        not widen what a crash can lose), then add them to the index. Blocking."""
        try:
            ids = store.add(batch)
        except BaseException:
            self._unsaved = batch  # none of it stored: written once the store works again
            raise
        vecs = query_vectors(self._engine, [e.query for e in batch])
        space = self._engine.space
        if vecs is not None and space is not None:
            store.set_vectors(ids, vecs, space)
            batch = [_with(e, i, v, space) for e, i, v in zip(batch, ids, vecs)]
        else:
            batch = [_with(e, i, None, None) for e, i in zip(batch, ids)]
        with self._lock:
            self._index.add(batch)
            self._oldest = min([self._oldest, *(e.at for e in batch)])

    async def _poll_loop(self, store: UsageStore) -> None:
        """Pick up changes by another writer (the CLI's forget/reset), retention, and
        vectors for events stored while no model was loaded."""
        while True:
            await anyio.sleep(POLL_S)
            reload = await anyio.to_thread.run_sync(store.changed_elsewhere)
            # In a worker: a build holds the index lock (~0.4 s at 50,000 events), and taken
            # on the loop it held up every search and call of the daemon.
            missing, stale = await anyio.to_thread.run_sync(self._checks)
            if missing and await anyio.to_thread.run_sync(_embed_missing, self._engine, store):
                reload = True
            if reload or stale or time.monotonic() - self._pruned > PRUNE_EVERY_S:
                await anyio.to_thread.run_sync(self._reload, store)

    def _checks(self) -> tuple[bool, bool]:
        cfg = self._cfg()  # stale: over `max_events` and a slack (not a reload at every event),
        with self._lock:  # or one past `retention_days` (no longer counts, not at the hourly prune)
            return (self._engine.embedder is not None and self._index.missing > 0,
                    self._index.n_events > cfg.max_events + max(1, cfg.max_events // 20)
                    or self._oldest < self._clock() - cfg.retention_days * 86400.0)


async def _forget(svc: LearningService, tool: str | None, until: float) -> int:
    store, state_dir = svc._store, svc._state_dir  # noqa: SLF001 (its service's own store)
    if store is not None:
        n = await anyio.to_thread.run_sync(forget_until, store, tool, until)
        await anyio.to_thread.run_sync(svc._reload, store)  # noqa: SLF001
        return n
    # Not opened in this process (learning off): a connection of its own. Never beside the
    # service's: opening a file closes a descriptor, which drops the process's POSIX locks.
    if state_dir is None or not (state_dir / USAGE_FILENAME).exists():
        return 0

    def once() -> int:
        own = open_store(state_dir)
        try:
            return forget_until(own, tool, until)
        finally:
            own.close()
    return await anyio.to_thread.run_sync(once)


def status_section(engine: Engine, enabled: bool, error: str | None,
                   scope: frozenset[str] | None = None) -> dict[str, Any]:
    """catalog_status's `learning` section: `enabled`, the engine's learned state, `error`.
    With a `scope` (the servers a caller may use, when not all), only the feedback on their
    tools counts: a caller reads no figure of what others did with tools it may not use."""
    state = engine.learned
    updated = max(state.tool_at, default=None) if state is not None else None
    events = state.events if state is not None else 0
    tools = len(state.tools) if state is not None else 0
    if state is not None and scope is not None:
        mine = [i for i, name in enumerate(state.tools) if (p := split(name)) is not None and p[0] in scope]
        rows = state.row_tools
        per_tool = np.bincount(rows.tool, weights=rows.count, minlength=len(state.tools))
        events, tools = int(per_tool[mine].sum()), len(mine)
        # the latest event on a tool in scope, not the latest anywhere (it may be on a tool the caller may not use)
        updated = max((state.tool_at[i] for i in mine), default=None) if events else None
    return {
        "enabled": enabled,
        "events": events,
        "tools_with_feedback": tools,
        "updated_at": (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(updated)) if updated else None),
        **({"error": error} if error is not None else {}),
    }


def _prune(store: UsageStore, cfg: LearningSection, now: float) -> None:
    """Delete events past `retention_days` and all but the newest `max_events`. Blocking."""
    retention = cfg.retention_days * 86400.0
    # ahead of time by up to an hour (1 % of retention): an event held past retention makes the
    # next poll reload (`_checks`), and under steady use that is then once per this span
    store.prune(now - retention + min(PRUNE_EVERY_S, retention / 100))
    if trimmed := store.trim(cfg.max_events):
        log.info("learning: the %d oldest usage events deleted (max_events = %d)", trimmed, cfg.max_events)


def _embed_missing(engine: Engine, store: UsageStore) -> bool:
    """Embed stored events that lack a vector of the engine's model; whether any got one."""
    todo = [e for e in store.events() if e.vector is None or e.space != engine.space]
    space = engine.space
    done = False
    for s in range(0, len(todo), EMBED_BATCH):
        chunk = todo[s : s + EMBED_BATCH]
        vecs = query_vectors(engine, [e.query for e in chunk])
        if vecs is None or space is None:
            break
        store.set_vectors([e.id for e in chunk], vecs, space)
        done = True
    return done


def publish_rest(cost: float) -> float:
    """Seconds between a learned state that took `cost` seconds to build and the next."""
    return max(PUBLISH_EVERY_S, PUBLISH_COST_FACTOR * cost)


def _without_vector(e: UsageEvent) -> UsageEvent:
    return _with(e, e.id, None, None)


def _with(e: UsageEvent, id: int, vector: Any, space: str | None) -> UsageEvent:
    return UsageEvent(query=e.query, tool=e.tool, principal=e.principal, at=e.at, index_version=e.index_version,
                      vector=vector, space=space, id=id)


async def _guarded(loop: Callable[[UsageStore], Awaitable[None]], store: UsageStore,
                   failure: list[BaseException], scope: anyio.CancelScope) -> None:
    """Run `loop`; a store failure ends it and its sibling (`run` opens the store again)."""
    try:
        await loop(store)
    except (sqlite3.Error, OSError) as exc:
        failure.append(exc)
        scope.cancel()


async def _close_quietly(store: UsageStore | None) -> None:
    if store is not None:
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(store.close)
            except (sqlite3.Error, OSError) as exc:
                log.debug("learning: closing a failed usage store: %s", exc)


def _move_aside(path: Path, exc: BaseException) -> None:
    """Rename an unreadable usage store (with its -wal and -shm) to `<name>.corrupt-<unix
    time>`, so the next open makes a new one. Blocking."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    try:
        for suffix in ("", "-wal", "-shm"):
            side = Path(str(path) + suffix)
            if side.exists():
                side.rename(Path(str(aside) + suffix))
    except OSError as err:
        log.warning("learning: usage store %s is unreadable (%s) and could not be moved aside: %s",
                    path, _describe(exc), err)
        return
    log.warning("learning: usage store %s is unreadable (%s): moved to %s; learning starts again from no events",
                path, _describe(exc), aside)


def _describe(exc: BaseException) -> str:
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name or type(exc).__name__})"


def _unreadable(exc: BaseException) -> bool:
    """SQLite says the file is not a database, or a corrupt one: no retry will read it."""
    return getattr(exc, "sqlite_errorname", None) in ("SQLITE_NOTADB", "SQLITE_CORRUPT")


__all__ = ["LearningService"]
