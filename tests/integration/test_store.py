"""The shared store against a real PostgreSQL (tests/support/postgres.py): migrations under
the advisory lock, idempotent writes, propagation between replicas through the port, and a
database that goes away and comes back while a replica keeps writing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolatlas.config import StoreSection
from toolatlas.redact import Redactor
from toolatlas.store.client import Store, StoreDown
from toolatlas.store.ports import APPROVAL, FEEDBACK, Change
from toolatlas.store.replica import Replica
from toolatlas.store.schema import MIGRATIONS

from tests.support.postgres import PgServer
from tests.support.waits import until

FAST = dict(catchup_interval=0.5, retry_interval=0.2, connect_timeout=2.0)


def section(url: str, **kw: Any) -> StoreSection:
    return StoreSection(url=url, **{**FAST, **kw})


@asynccontextmanager
async def running(replica: Replica) -> AsyncIterator[Replica]:
    async with anyio.create_task_group() as tg:
        await tg.start(replica.run)
        yield replica
        tg.cancel_scope.cancel()


def heard(replica: Replica, kind: str) -> list[Change]:
    got: list[Change] = []

    async def handler(change: Change) -> None:
        got.append(change)

    replica.subscribe(kind, handler)
    return got


async def test_two_replicas_starting_together_migrate_once(pg_url: str) -> None:
    stores = [Store(pg_url, origin=f"r{i}", connect_timeout=5, redactor=Redactor()) for i in range(4)]
    results: list[list[int]] = []
    with anyio.fail_after(60):
        for s in stores:
            await s.connect()

        async def migrate(s: Store) -> None:
            results.append(await s.migrate())

        async with anyio.create_task_group() as tg:
            for s in stores:
                tg.start_soon(migrate, s)
        for s in stores:
            await s.close()
    every = [v for v, _, _ in MIGRATIONS]
    assert sorted(results, key=len) == [[], [], [], every]  # one applied them, the others found them done
    import psycopg

    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT version, applied_by FROM toolatlas_schema ORDER BY version").fetchall()
    assert [r[0] for r in rows] == every and len({r[1] for r in rows}) == 1


async def test_writes_are_idempotent_and_state_is_newest_wins(pg_url: str) -> None:
    store = Store(pg_url, origin="a", connect_timeout=5, redactor=Redactor())
    with anyio.fail_after(60):
        await store.connect()
        await store.migrate()
        ev = {"t": "event", "kind": FEEDBACK, "key": "x__y", "body": {"n": 1}, "origin": "a", "idem": "e1", "at": 100.0}
        await store.write([ev])
        await store.write([ev, ev])  # re-sent after a crash: lands once
        new = {"t": "state", "kind": APPROVAL, "key": "up", "body": {"state": "approved"}, "origin": "a",
               "idem": "s2", "at": 200.0}
        old = {**new, "body": {"state": "pending"}, "idem": "s1", "at": 150.0}
        await store.write([new])
        await store.write([old])  # an older write arriving late changes nothing
        await store.write([new])
        events = await store.events_after(0)
        states = await store.state_after(0)
        await store.close()
    assert [(e.kind, e.key, e.body) for e in events] == [(FEEDBACK, "x__y", {"n": 1})]
    assert [(s.key, s.body) for s in states] == [("up", {"state": "approved"})]


async def test_changes_reach_the_other_replica_not_the_writer(pg_url: str, tmp_path: Path) -> None:
    a = Replica(section(pg_url), str(tmp_path / "a"))
    b = Replica(section(pg_url), str(tmp_path / "b"))
    at_a, at_b = heard(a, FEEDBACK), heard(b, FEEDBACK)
    approvals_b = heard(b, APPROVAL)
    with anyio.fail_after(60):
        async with running(a), running(b):
            await until(lambda: a.connected and b.connected, "A and B connect")
            await a.append(FEEDBACK, "notes__search", {"query": "q", "useful": True})
            await a.put(APPROVAL, "files", {"state": "approved", "by": "ops"})
            await until(lambda: at_b and approvals_b, "B hears A's event and state")
            assert at_a == []  # a replica does not hear its own writes back
            assert at_b[0].body == {"query": "q", "useful": True} and at_b[0].origin == a.origin
            assert approvals_b[0].key == "files" and approvals_b[0].body["state"] == "approved"
            # A replica that connects later still gets the state (not the old events).
            c = Replica(section(pg_url), str(tmp_path / "c"))
            approvals_c, events_c = heard(c, APPROVAL), heard(c, FEEDBACK)
            async with running(c):
                await until(lambda: approvals_c, "C reads the existing state")
                await b.append(FEEDBACK, "notes__add", {"useful": False})
                await until(lambda: len(at_a) == 1 and events_c, "A and C hear B's event")
            assert [e.key for e in events_c] == ["notes__add"]
            # B counts its write as sent once it has marked it done, maybe after the others heard it
            await until(lambda: a.status()["buffered"] == 0 and b.status()["sent"] == 1, "the writers' books")


async def test_writes_wait_on_disk_while_the_database_is_down(tmp_path: Path, pg_private: PgServer) -> None:
    pg = pg_private
    url = pg.new_database()
    a = Replica(section(url), str(tmp_path / "a"))
    b = Replica(section(url), str(tmp_path / "b"))
    at_b = heard(b, FEEDBACK)
    with anyio.fail_after(120):
        async with running(a), running(b):
            await a.append(FEEDBACK, "k", {"i": -1})
            await until(lambda: len(at_b) == 1, "B hears the first event")
            await anyio.to_thread.run_sync(pg.stop)
            await until(lambda: not a.connected, "A notices the database is gone")
            assert "shared store" in (a.status()["error"] or "")
            for i in range(20):
                await a.append(FEEDBACK, "k", {"i": i})
            assert a.status()["buffered"] == 20
            assert a.outbox.pending_bytes > 0
            await anyio.to_thread.run_sync(pg.start)
            await until(lambda: a.connected and a.status()["buffered"] == 0, "A flushes its buffer", 30)
            await until(lambda: len(at_b) == 21, "B hears every buffered event", 30)
    assert [c.body["i"] for c in at_b] == list(range(-1, 20))  # in order, each once
    rows = pg.psql("SELECT count(*), count(DISTINCT idem) FROM toolatlas_events", db=url.rsplit("/", 1)[1])
    assert rows == [(21, 21)]
    assert a.counts["reconnects"] >= 1


async def test_an_unreachable_store_at_start_does_not_block(tmp_path: Path) -> None:
    from tests.support.ports import free_port

    url = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
    r = Replica(section(url), str(tmp_path))
    with anyio.fail_after(30):
        async with running(r):
            await until(lambda: "connect failed" in (r.error or ""), "the first attempt fails")
            assert not r.connected
            await r.append(FEEDBACK, "k", {"x": 1})  # accepted: buffered on disk
            assert r.status()["buffered"] == 1
    with pytest.raises(StoreDown, match="not connected"):
        await Store(url, origin="x", connect_timeout=1, redactor=Redactor()).events_after(0)


async def test_why_the_store_is_unreachable_is_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """libpq's message for a refused connection spans lines (a hint after a tab); the
    status's `error` and the log say it on one line, as `doctor` does."""
    from tests.support.ports import free_port

    r = Replica(section(f"postgresql://nobody:pw@127.0.0.1:{free_port()}/none"), str(tmp_path))
    with anyio.fail_after(30):
        async with running(r):
            error = r.status()["error"] or ""
    assert "Connection refused" in error and "Is the server running" in error
    assert "\n" not in error and "\t" not in error and "  " not in error
    said = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("store.unreachable")]
    assert said and all("\n" not in line for line in said)


async def test_the_multi_host_url_of_the_deployment_guide_is_taken_and_reaches_the_primary(
        pg_url: str, tmp_path: Path) -> None:
    """docs/deployment.md points `url` at a primary and a standby in one libpq URL
    (`host1:port,host2:port`, `target_session_attrs=read-write`); the config takes it and the
    replica connects to whichever host answers as the primary (here the second: the first
    refuses). A bad port in the list is still a config error naming it."""
    from toolatlas.config import parse
    from toolatlas.errors import ConfigError
    from tests.support.ports import free_port

    live = pg_url.split("@", 1)[1].split("/", 1)[0]  # 127.0.0.1:PORT
    url = pg_url.replace(live, f"127.0.0.1:{free_port()},{live}") + "?target_session_attrs=read-write"
    cfg = parse(f'[store]\nurl = "{url}"\nconnect_timeout = 2\n')
    r = Replica(section(cfg.store.url), str(tmp_path))
    with anyio.fail_after(30):
        async with running(r):
            await until(lambda: r.connected, "the replica connects to the second host")
    with pytest.raises(ConfigError, match=r"\[store\] url .*'nope'"):
        parse(f'[store]\nurl = "{url.replace(live, "127.0.0.1:nope")}"\n')


async def test_a_url_naming_the_unix_socket_as_a_host_parameter_is_taken(pg_server: PgServer, pg_url: str,
                                                                          tmp_path: Path) -> None:
    """libpq takes the host (a Unix socket's folder, for a database on the same machine) as a
    `host` query parameter, the authority left empty: the config takes that URL too."""
    from toolatlas.config import parse

    db = pg_url.rsplit("/", 1)[1]
    url = f"postgresql:///{db}?host={pg_server.sockdir}&port={pg_server.port}&user=toolatlas"
    r = Replica(section(parse(f'[store]\nurl = "{url}"\n').store.url), str(tmp_path))
    with anyio.fail_after(30):
        async with running(r):
            await until(lambda: r.connected, "the replica connects through the socket")


async def test_a_schema_newer_than_this_replica_knows_is_shown_as_it_is(pg_server: PgServer, pg_url: str,
                                                                          tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """During a rolling upgrade a replica not upgraded yet meets the schema a newer one migrated
    to: it keeps working on the tables it knows, and its status and log say which schema the
    database has (as `doctor` does), not the version this build would apply."""
    from toolatlas.store.schema import LATEST

    first = Store(pg_url, origin="new", connect_timeout=5, redactor=Redactor())
    with anyio.fail_after(60):
        await first.connect()
        await first.migrate()
        await first.close()
        pg_server.psql(f"INSERT INTO toolatlas_schema (version, name, applied_by) VALUES ({LATEST + 1}, 'next', 'new')",
                       db=pg_url.rsplit("/", 1)[1])
        r = Replica(section(pg_url), str(tmp_path))
        async with running(r):
            await until(lambda: r.connected, "the replica connects")
            assert r.status()["schema_version"] == LATEST + 1
    assert any(f"newer than this toolatlas knows ({LATEST})" in rec.getMessage() for rec in caplog.records)


async def test_an_operation_waiting_its_turn_when_the_link_closes_is_store_down(pg_url: str) -> None:
    """Operations on the store's connection take turns. One waiting its turn while the link is
    closed under it (the database went away, the replica reconnects) fails as the store being
    down, which every caller handles, not as an AttributeError that ends the daemon's task."""
    import psycopg

    from toolatlas.store.schema import WRITE_LOCK

    store = Store(pg_url, origin="a", connect_timeout=5, redactor=Redactor())
    outcomes: list[str] = []

    async def attempt(op: Any) -> None:
        try:
            await op()
            outcomes.append("done")
        except StoreDown:
            outcomes.append("down")
        except Exception as exc:  # what must not happen
            outcomes.append(type(exc).__name__)

    ev = {"t": "event", "kind": FEEDBACK, "key": "k", "body": {}, "origin": "a", "idem": "e1", "at": 1.0}
    with anyio.fail_after(60):
        await store.connect()
        await store.migrate()
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))  # the write waits for it
            def write_waits() -> bool:
                row = other.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
                                    "AND query LIKE %s", ("%pg_advisory_xact_lock%",)).fetchone()
                return bool(row and row[0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, lambda: store.write([ev]))
                await until(write_waits, "the write holding the turn waits in the database")
                tg.start_soon(attempt, lambda: store.events_after(0))
                await until(lambda: store._lock.statistics().tasks_waiting == 1, "the read waiting its turn")
                await store.close()
    assert outcomes == ["down", "down"]


async def test_a_write_the_database_refuses_does_not_hold_back_the_others(pg_url: str, tmp_path: Path) -> None:
    a = Replica(section(pg_url), str(tmp_path / "a"))
    b = Replica(section(pg_url), str(tmp_path / "b"))
    at_b = heard(b, FEEDBACK)
    with anyio.fail_after(60):
        async with running(a), running(b):
            await a.append(FEEDBACK, "k", {"i": 1})
            await a.append(FEEDBACK, "k", {"text": "nul \u0000 inside"})  # jsonb refuses U+0000
            await a.append(FEEDBACK, "k", {"i": 3})
            await until(lambda: len(at_b) == 2, "B hears the two good events")
            assert [c.body for c in at_b] == [{"i": 1}, {"i": 3}]
            # A marks a batch done in its buffer after the commit B may already have heard
            await until(lambda: a.status()["buffered"] == 0, "A's buffer is empty")
            assert a.status()["rejected"] == 1


async def test_a_reader_following_the_cursor_misses_nothing_under_concurrent_writers(pg_url: str) -> None:
    """Ids are handed out in commit order (the write lock), so reading `id > last seen` while
    four replicas write at once still sees every event."""
    writers = [Store(pg_url, origin=f"w{i}", connect_timeout=5, redactor=Redactor()) for i in range(4)]
    reader = Store(pg_url, origin="r", connect_timeout=5, redactor=Redactor())
    seen: list[str] = []
    with anyio.fail_after(120):
        for s in [*writers, reader]:
            await s.connect()
        await reader.migrate()

        async def write(s: Store) -> None:
            for i in range(40):
                await s.write([{"t": "event", "kind": FEEDBACK, "key": f"{s.origin}-{i}", "body": {},
                                "origin": s.origin, "idem": f"{s.origin}-{i}", "at": 1.0}])

        cursor = 0
        async with anyio.create_task_group() as tg:
            for s in writers:
                tg.start_soon(write, s)
            while len(seen) < 160:
                for change in await reader.events_after(cursor):
                    cursor = change.seq
                    seen.append(change.key)
                await anyio.sleep(0)
        for s in [*writers, reader]:
            await s.close()
    assert sorted(seen) == sorted(f"w{w}-{i}" for w in range(4) for i in range(40))


async def test_usage_events_buffered_before_a_forget_never_land_in_the_store(pg_url: str, tmp_path: Path) -> None:
    """`learning forget` while a replica holds usage events in its buffer (the database was
    down for it): when that buffer is sent, the forgotten tool's events stay out of the
    shared store (they hold users' queries), the others land."""
    import time

    from toolatlas.store.ports import FEEDBACK_FORGET

    a = Replica(section(pg_url), str(tmp_path / "a"))
    await a.append(FEEDBACK, "notes__search", {"query": "private words"})  # not connected: on disk only
    await a.append(FEEDBACK, "files__read", {"query": "kept"})
    cli = Store(pg_url, origin="cli", connect_timeout=5, redactor=Redactor())
    with anyio.fail_after(60):
        await cli.connect()
        await cli.migrate()
        assert await cli.forget_feedback("notes__search", time.time()) == 0  # nothing there yet
        await cli.close()
        await a.append(FEEDBACK, "notes__search", {"query": "after the forget"})
        async with running(a):
            await until(lambda: a.status()["buffered"] == 0, "A sends its buffer")
    import psycopg

    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT key, body->>'query' FROM toolatlas_events WHERE kind <> %s ORDER BY id",
                            (FEEDBACK_FORGET,)).fetchall()
    assert rows == [("files__read", "kept"), ("notes__search", "after the forget")]


async def test_a_replica_pointed_at_a_restored_or_new_database_misses_nothing(pg_server: PgServer,
                                                                             tmp_path: Path) -> None:
    """A replica's event cursor (kept in state_dir) can be past every event of the database it
    connects to: a database restored from a backup, or a new one. It reads that database's
    events from where they end, instead of skipping them until the ids pass its old cursor."""
    old, new = pg_server.new_database(), pg_server.new_database()
    a, b = Replica(section(old), str(tmp_path / "a")), Replica(section(old), str(tmp_path / "b"))
    at_b = heard(b, FEEDBACK)
    with anyio.fail_after(90):
        async with running(a), running(b):
            for i in range(5):
                await a.append(FEEDBACK, "k", {"i": i})
            await until(lambda: len(at_b) == 5, "B hears A's events in the old database")
        # The same replicas, their state_dirs kept, on the restored (here: new) database.
        a2, b2 = Replica(section(new), str(tmp_path / "a")), Replica(section(new), str(tmp_path / "b"))
        at_b2 = heard(b2, FEEDBACK)
        async with running(b2):
            async with running(a2):
                await a2.append(FEEDBACK, "k", {"i": "after the restore"})
                await until(lambda: at_b2, "B hears A's event in the new database")
    assert [c.body for c in at_b2] == [{"i": "after the restore"}]


async def test_a_database_that_stops_answering_is_said_so(tmp_path: Path, pg_private: PgServer) -> None:
    """A database host that hangs (its processes stopped: connections are accepted, nothing is
    answered) is said so in one line naming the wait, at start and mid-run, not 'failed:'
    followed by nothing."""
    url = pg_private.new_database()
    a = Replica(section(url), str(tmp_path / "a"))
    try:
        with anyio.fail_after(90):
            async with running(a):
                pg_private.pause()
                await until(lambda: not a.connected, "A notices the database does not answer", 30)
                assert "did not answer within 10 s" in (a.status()["error"] or ""), a.status()["error"]
            late = Replica(section(url), str(tmp_path / "late"))
            async with running(late):
                await until(lambda: "connect failed:" in (late.status()["error"] or ""), "the first attempt ends", 30)
                assert not late.connected
                assert "timeout expired" in (late.status()["error"] or "") or "did not answer" in late.status()["error"]
    finally:
        pg_private.resume()



async def test_pruning_a_large_backlog_of_usage_events_stays_within_the_statement_limit(
        pg_server: PgServer, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first prune after an upgrade, or after retention_days was lowered, meets months of
    usage events. One DELETE of them all outlasted the statement limit (10 s; here lowered to
    0.5 s so 600,000 rows stand for a large fleet's tens of millions): the prune failed as the
    store down, cutting the replica's link. Deleted in batches, each within the limit, it
    returns how many it deleted."""
    import time

    from toolatlas.store import client

    n = 600_000
    store = Store(pg_url, origin="x", connect_timeout=5, redactor=Redactor())
    with anyio.fail_after(150):
        await store.connect()
        await store.migrate()
        await anyio.to_thread.run_sync(lambda: pg_server.psql(
            "INSERT INTO toolatlas_events (kind, key, body, origin, idem, written_at) SELECT 'feedback', 't', "
            "jsonb_build_object('query', 'an old query', 'n', g), 'old', 'old-' || g, now() - interval '400 days' "
            f"FROM generate_series(1, {n}) g; ANALYZE toolatlas_events", db=pg_url.rsplit("/", 1)[1]))
        monkeypatch.setattr(client, "OP_TIMEOUT_S", 0.5)
        try:
            assert await store.prune_events(FEEDBACK, time.time() - 180 * 86400) == n
        finally:
            await store.close()
