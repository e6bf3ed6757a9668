"""The learning service when its usage store fails (the daemon must stay up): a write the
store refuses is kept and written once it works again. The real SQLite store, with one
`add` made to fail as a full or failing disk does; the service is the unit under test."""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np

from tests.support.waits import until
from toolatlas.config import LearningSection
from toolatlas.gateway.learning import LearningService
from toolatlas.gateway.ports import Connection
from toolatlas.metrics import Metrics
from toolatlas.retrieval.engine import Engine
from toolatlas.retrieval.usage import SqliteUsageStore, UsageEvent


class FailingOnce(SqliteUsageStore):
    """The real store; its first `add` fails as SQLite does on a failing disk."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failures = 0

    def add(self, events: Sequence[UsageEvent]) -> list[int]:
        if self.failures == 0:
            self.failures += 1
            raise sqlite3.OperationalError("disk I/O error")
        return super().add(events)


async def test_a_write_the_store_refuses_is_written_once_it_works_again(tmp_path: Path) -> None:
    path = tmp_path / "learning.sqlite3"
    store = FailingOnce(path)
    engine = Engine(state_dir=None, embedder="none", mode="bm25")
    svc = LearningService(lambda: LearningSection(), engine, None, metrics=Metrics(), store=store)
    event = UsageEvent(query="read a file from disk", tool="fs__read_file", principal="uid:1", at=time.time(),
                       index_version=1)
    async with anyio.create_task_group() as tg:
        await tg.start(svc.run)
        assert await svc.ingest(event)
        await until(lambda: svc.error is not None, "the failure reported", 30)
        error = svc.error
        assert error is not None and "disk I/O error" in error and "trying again in" in error
        assert svc.status()["error"] == error
        await until(lambda: svc.status()["events"] == 1 and svc.error is None, "the event written on a retry", 30)
        assert "error" not in svc.status()
        tg.cancel_scope.cancel()
    svc._send.close()  # the event queue lives as long as a daemon; here, as long as the test
    svc._receive.close()
    assert store.failures == 1
    again = SqliteUsageStore(path)
    try:
        assert [(e.query, e.tool) for e in again.events()] == [(event.query, event.tool)]  # once, not lost
    finally:
        again.close()



def _full(store: SqliteUsageStore) -> None:
    """No page more for `store`, as on a full disk (SQLite fails the same way: SQLITE_FULL)."""
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_is_reported_as_such(tmp_path: Path) -> None:
    """SQLite rolls a transaction back by itself on SQLITE_FULL (a full disk): the store's own
    ROLLBACK must not then fail and hide why ("cannot rollback - no transaction is active"),
    so the operator reads "database or disk is full", and the store works once there is room."""
    store = SqliteUsageStore(tmp_path / "learning.sqlite3")
    try:
        events = [UsageEvent(query="q" * 8000, tool=f"fs__tool{i}", principal="uid:1", at=time.time(),
                             index_version=1) for i in range(4)]
        ids = store.add(events[:1])
        _full(store)
        for write in (lambda: store.add(events), lambda: store.set_vectors(ids, np.ones((1, 8192), np.float32), "x")):
            try:
                write()
            except sqlite3.Error as exc:
                assert getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL" and "full" in str(exc), repr(exc)
            else:
                raise AssertionError("a write went through a full database")
        store._db.execute("PRAGMA max_page_count = 1000000")  # room again
        assert len(store.add(events)) == 4 and len(store.events()) == 5
    finally:
        store.close()


async def test_a_store_that_keeps_failing_is_retried_with_growing_delays(tmp_path: Path) -> None:
    """A full disk stays full: the store opens, then refuses the write again at once. Each
    such round counts as a failed attempt, so the retries back off (1 s, 2 s, ... up to 60 s)
    instead of reopening and reloading every event, and logging, once a second for good."""
    store = SqliteUsageStore(tmp_path / "learning.sqlite3")
    _full(store)
    engine = Engine(state_dir=None, embedder="none", mode="bm25")
    svc = LearningService(lambda: LearningSection(), engine, None, metrics=Metrics(), store=store)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(svc.run)
            assert await svc.ingest(UsageEvent(query="q" * 20000, tool="fs__read_file", principal="uid:1", at=time.time(),
                                         index_version=1))
            await until(lambda: "SQLITE_FULL" in (svc.error or ""), "the failure reported", 30)
            await until(lambda: "trying again in 2 s" in (svc.error or ""), "a longer delay after a second failure", 15)
            tg.cancel_scope.cancel()
    finally:
        svc._send.close()
        svc._receive.close()
        store.close()


def test_a_store_deleted_under_the_daemon_is_taken_as_a_wipe_not_filled_unlinked(tmp_path: Path) -> None:
    """state_dir (or the store file) removed while the daemon runs: SQLite would go on writing
    into the unlinked file, which vanishes at the next start, while the daemon kept learning
    from events nobody can see or wipe. The check the daemon makes each second
    (`changed_elsewhere`) takes the deletion as a wipe: a new empty store at the path, and
    "changed" so the daemon reloads (and forgets). The deleted events are never written back."""
    state = tmp_path / "state"
    store = SqliteUsageStore(state / "learning.sqlite3")
    try:
        event = UsageEvent(query="read a file", tool="fs__read_file", principal="uid:1", at=time.time(), index_version=1)
        store.add([event, event])
        assert not store.changed_elsewhere()
        shutil.rmtree(state)
        store.add([event])  # into the unlinked file, as the daemon's writer would
        assert store.changed_elsewhere()  # the daemon reloads: no events
        assert store.events() == [] and (state / "learning.sqlite3").stat().st_mode & 0o777 == 0o600
        store.add([event])  # and it goes on in the new file
        assert len(store.events()) == 1 and not store.changed_elsewhere()
        again = SqliteUsageStore(state / "learning.sqlite3")
        try:
            assert len(again.events()) == 1  # on disk: only what came after the deletion
        finally:
            again.close()
    finally:
        store.close()


async def test_an_event_dropped_for_a_writer_far_behind_is_counted(tmp_path: Path) -> None:
    """A usage event the queue has no room for (its writer 10,000 events behind) is dropped,
    not waited for, and counted as `dropped`: the feedback counter accounts for every call
    after a search."""
    engine = Engine(state_dir=None, embedder="none", mode="bm25")
    metrics = Metrics()
    svc = LearningService(lambda: LearningSection(), engine, None, metrics=metrics,
                          store=SqliteUsageStore(tmp_path / "learning.sqlite3"))
    conn = Connection(id=1, uid=1000)
    filler = UsageEvent(query="q", tool="fs__read_file", principal="uid:1", at=time.time(), index_version=1)
    try:
        while True:  # bounded: the queue holds 10,000
            svc._send.send_nowait(filler)
    except anyio.WouldBlock:
        pass
    svc.searched(conn, "read a file", ["fs__read_file"], 1)
    svc.executed(conn, "fs__read_file", True)
    text = metrics.expose()[0].decode()
    assert 'toolatlas_feedback_events_total{outcome="dropped"} 1.0' in text, text
    assert 'outcome="recorded"} 1.0' not in text
    svc._send.close()
    svc._receive.close()
