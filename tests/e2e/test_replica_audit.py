"""The shared audit trail (issue 21 with the governance issue's `[events] audit_file`): with a
store configured, every audit record a replica writes to its audit file also lands in the
store exactly once, with the replica's name, readable in the view `toolatlas_audit`; records
written while PostgreSQL is down wait on disk (through a SIGKILL too) and land once when it
returns. Real daemons, a real PostgreSQL."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_replicas import store_block, store_status
from tests.support.daemon import Daemon, url_upstream
from tests.support.postgres import PgServer
from tests.support.servers import RunningServer


def audited_replica(tmp: Path, name: str, url: str, srv: RunningServer) -> Daemon:
    (tmp / name).mkdir(exist_ok=True)
    cfg = (store_block(url) + f'[events]\naudit_file = "{tmp / name / "audit.jsonl"}"\n'
           + url_upstream("shared", "http", srv.url, "relist_interval = 0\n"))
    return Daemon(tmp / name, cfg)


def file_records(d: Daemon) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (d.tmp / "audit.jsonl").read_text().splitlines()]


def store_records(pg: PgServer, url: str) -> list[tuple[str, str, str | None, dict[str, Any]]]:
    """(replica, event, principal, record) of every row of the view, in id order."""
    rows = pg.psql("SELECT replica, event, principal, record FROM toolatlas_audit ORDER BY id", db=url.rsplit("/", 1)[1])
    return [(str(r[0]), str(r[1]), None if r[2] is None else str(r[2]), dict(r[3])) for r in rows]


def audit_idems(pg: PgServer, url: str) -> list[int]:
    rows = pg.psql("SELECT count(*) FROM toolatlas_events WHERE kind = 'audit' GROUP BY idem", db=url.rsplit("/", 1)[1])
    return [int(str(r[0])) for r in rows]


def landed_once(pg: PgServer, url: str, d: Daemon, origin: str) -> bool:
    """Every line of `d`'s audit file is in the store once, from `origin`, and nothing else of it."""
    mine = [rec for replica, _, _, rec in store_records(pg, url) if replica == origin]
    return sorted(json.dumps(r, sort_keys=True) for r in mine) == sorted(json.dumps(r, sort_keys=True) for r in file_records(d))


@pytest.fixture
def shared_server(spawn_server: Any) -> RunningServer:
    return spawn_server("testserver", "http", ["--tools", "5"])


def test_audited_actions_on_two_replicas_land_in_the_store_once_each(
    tmp_path: Path, pg_server: PgServer, shared_server: RunningServer,
) -> None:
    url = pg_server.new_database()
    a, b = audited_replica(tmp_path, "a", url, shared_server), audited_replica(tmp_path, "b", url, shared_server)
    with a, b:
        origin_a, origin_b = store_status(a)["replica"], store_status(b)["replica"]
        assert origin_a != origin_b
        assert "shared__echo" in a.search("echo the message back", 3)
        out = a.tool("execute_tool", {"name": "shared__echo", "arguments": {"message": "from A"}})
        assert not out.get("isError"), out
        assert "shared__echo" in b.search("echo the message back on B", 3)
        events_a = [r["event"] for r in file_records(a)]
        assert "tool_search_completed" in events_a and "execute_tool_completed" in events_a
        a.wait_for(lambda: landed_once(pg_server, url, a, origin_a), 20, "A's audit records in the store")
        b.wait_for(lambda: landed_once(pg_server, url, b, origin_b), 20, "B's audit records in the store")
        rows = store_records(pg_server, url)
        call = next(r for r in rows if r[1] == "execute_tool_completed")
        assert call[0] == origin_a and call[2] == call[3]["principal"] and call[3]["name"] == "shared__echo"
        assert {r[0] for r in rows if r[1] == "tool_search_completed"} == {origin_a, origin_b}
        assert set(audit_idems(pg_server, url)) == {1}
        assert store_status(a)["audit_buffered"] == 0
        # Another replica's audit records are not read back by a replica (no subscriber).
        assert store_status(b)["received"] == 0
        # A replica that stops sends its last records before it exits (it does not wait for
        # its next start).
        assert b.search("one more search just before the stop", 3) is not None
        assert b.stop() == 0
        assert landed_once(pg_server, url, b, origin_b)


def test_audit_records_written_while_the_database_is_down_land_once_after_a_sigkill(
    tmp_path: Path, pg_private: PgServer, shared_server: RunningServer,
) -> None:
    pg = pg_private
    url = pg.new_database()
    a = audited_replica(tmp_path, "a", url, shared_server)
    with a:
        origin = store_status(a)["replica"]
        a.search("echo before the outage", 3)
        a.wait_for(lambda: landed_once(pg, url, a, origin), 20, "the first record in the store")
        pg.stop()
        a.wait_for(lambda: not store_status(a)["connected"], 20, "A sees the store down")
        for i in range(5):
            assert a.search(f"echo during the outage {i}", 3)
            out = a.tool("execute_tool", {"name": "shared__echo", "arguments": {"message": f"outage {i}"}})
            assert not out.get("isError"), out
        status = a.wait_for(lambda: (s := store_status(a))["audit_buffered"] >= 10 and s, 20, "audit buffered")
        assert status["buffered"] >= status["audit_buffered"]
        a.stop(signal.SIGKILL)  # with the records in its spool
    pg.start()
    with a.start():  # the same config and state_dir
        a.wait_for(lambda: store_status(a)["audit_buffered"] == 0, 30, "the spool sent")
        a.search("echo after the restart", 3)
        a.wait_for(lambda: landed_once(pg, url, a, origin), 20, "every record in the store")
    events = [event for _, event, _, _ in store_records(pg, url)]
    assert events.count("execute_tool_completed") == 5 and events.count("tool_search_completed") == 7
    assert set(audit_idems(pg, url)) == {1}
