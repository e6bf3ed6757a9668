"""`[learning] max_events`: the usage store and the learned state hold at most the newest
events (memory and each learned state's cost grow with them), and learned states are
published no more often than their cost allows. The real SQLite store; the learning service
is the unit under test."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from tests.support.waits import until
from toolatlas.config import LearningSection
from toolatlas.gateway.learning import PUBLISH_COST_FACTOR, PUBLISH_EVERY_S, LearningService, publish_rest
from toolatlas.metrics import Metrics
from toolatlas.retrieval.engine import Engine
from toolatlas.retrieval.usage import MemoryUsageStore, SqliteUsageStore, UsageEvent, UsageStore


def _events(n: int, t0: float) -> list[UsageEvent]:
    return [UsageEvent(query=f"read file number {i}", tool="fs__read_file", principal="uid:1", at=t0 + i,
                       index_version=1) for i in range(n)]


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_trim_keeps_the_newest_events(tmp_path: Path, kind: str) -> None:
    store: UsageStore = SqliteUsageStore(tmp_path / "learning.sqlite3") if kind == "sqlite" else MemoryUsageStore()
    try:
        store.add(_events(10, 1000.0))
        assert store.trim(20) == 0 and len(store.events()) == 10
        assert store.trim(4) == 6
        assert [e.query for e in store.events()] == [f"read file number {i}" for i in range(6, 10)]
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_forget_until_keeps_what_came_after(tmp_path: Path, kind: str) -> None:
    """A forget through the shared store deletes the events up to its moment: one recorded
    later on this replica (after the operator's command) stays."""
    from toolatlas.retrieval.usage import forget_until

    store: UsageStore = SqliteUsageStore(tmp_path / "learning.sqlite3") if kind == "sqlite" else MemoryUsageStore()
    try:
        other = UsageEvent(query="list files", tool="fs__list", principal="uid:1", at=1003.0, index_version=1)
        store.add([*_events(4, 1000.0), other])  # fs__read_file at 1000..1003
        assert forget_until(store, "fs__read_file", 1001.0) == 2
        assert [(e.tool, e.at) for e in store.events()] == [("fs__read_file", 1002.0), ("fs__read_file", 1003.0),
                                                             ("fs__list", 1003.0)]
        assert forget_until(store, None, 1003.0) == 3 and store.events() == []
    finally:
        store.close()


async def _serve(svc: LearningService, check: object) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(svc.run)
        await check()  # type: ignore[operator]
        tg.cancel_scope.cancel()
    svc._send.close()  # the event queue lives as long as a daemon; here, as long as the test
    svc._receive.close()


def _service(store: UsageStore, cap: int) -> LearningService:
    engine = Engine(state_dir=None, embedder="none", mode="bm25")
    return LearningService(lambda: LearningSection(max_events=cap), engine, None, metrics=Metrics(), store=store)


async def test_events_past_max_events_are_deleted_from_the_store_and_the_learned_state(tmp_path: Path) -> None:
    path = tmp_path / "learning.sqlite3"
    store = SqliteUsageStore(path)
    svc = _service(store, 5)

    async def check() -> None:
        for e in _events(12, time.time()):
            assert await svc.ingest(e)
        # 12 held > 5 + slack: the next poll trims to the newest 5 and publishes them
        await until(lambda: svc.status()["events"] == 5, "the learned state trimmed to max_events", 30)

    await _serve(svc, check)
    again = SqliteUsageStore(path)
    try:
        assert [e.query for e in again.events()] == [f"read file number {i}" for i in range(7, 12)]
    finally:
        again.close()


async def test_a_store_over_max_events_is_trimmed_when_learning_starts(tmp_path: Path) -> None:
    path = tmp_path / "learning.sqlite3"
    seed = SqliteUsageStore(path)
    seed.add(_events(30, time.time() - 60))
    seed.close()
    store = SqliteUsageStore(path)
    svc = _service(store, 8)

    async def check() -> None:
        await until(lambda: svc.status()["events"] == 8, "the store's newest 8 events loaded", 30)

    await _serve(svc, check)
    again = SqliteUsageStore(path)
    try:
        assert len(again.events()) == 8
    finally:
        again.close()


def test_a_costly_learned_state_is_followed_by_a_rest_in_proportion() -> None:
    assert publish_rest(0.001) == PUBLISH_EVERY_S  # a small state: as often as before
    assert publish_rest(2.0) == pytest.approx(2.0 * PUBLISH_COST_FACTOR)  # a big one: a tenth of a core at most


async def test_a_replica_catching_up_hands_over_more_events_than_the_queue_holds_and_none_is_lost(
    tmp_path: Path,
) -> None:
    """A replica back after a while reads the other replicas' feedback in batches and ingests
    each event without pausing in between: past the writer's queue (10,000) they used to be
    dropped, and the replica's event cursor moved past them for good."""
    path = tmp_path / "learning.sqlite3"
    store = SqliteUsageStore(path)
    svc = _service(store, 50_000)
    n = 12_000
    taken: list[bool] = []

    async def check() -> None:
        for e in _events(n, time.time() - n):
            taken.append(await svc.ingest(e))
        await until(lambda: svc.status()["events"] == n, "every shared event learned", 60)

    await _serve(svc, check)
    assert all(taken)
    again = SqliteUsageStore(path)
    try:
        assert len(again.events()) == n
    finally:
        again.close()



async def test_the_index_lock_is_never_taken_on_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker holds the index lock while it builds a learned state (~0.4 s at 50,000
    events). The once-a-second poll took that lock on the event loop, so every search and
    call of the daemon could wait behind a build. Every taker of the lock (writer,
    publisher, poller, reload) must be a worker thread."""
    import threading

    import toolatlas.gateway.learning as learning

    monkeypatch.setattr(learning, "POLL_S", 0.0)
    store = SqliteUsageStore(tmp_path / "learning.sqlite3")
    svc = _service(store, 100)
    polls: list[bool] = []
    changed = store.changed_elsewhere
    monkeypatch.setattr(store, "changed_elsewhere", lambda: polls.append(True) or changed())
    lock, takers = svc._lock, []

    class Recording:
        def __enter__(self) -> bool:
            takers.append(threading.get_ident())
            return lock.__enter__()

        def __exit__(self, *exc: object) -> None:
            lock.__exit__(*exc)  # type: ignore[arg-type]

    svc._lock = Recording()  # type: ignore[assignment]

    async def check() -> None:
        for e in _events(3, time.time()):
            assert await svc.ingest(e)
        await until(lambda: svc.status()["events"] == 3, "the events learned", 30)
        polls.clear()
        await until(lambda: len(polls) >= 3, "three polls", 30)

    loop_thread = threading.get_ident()
    await _serve(svc, check)
    store.close()
    assert takers and loop_thread not in takers
