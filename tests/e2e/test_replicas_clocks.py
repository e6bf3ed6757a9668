"""Replicas whose clocks disagree (issue 21): a shared decision is ordered after the one it
replaces, so an operator's later approve or reject holds on every replica even when another
replica's clock ran ahead. Real daemons, a real PostgreSQL; the replica with the fast clock is
played by a write into the store as it would make it."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_replicas import replica, store_block
from tests.support.daemon import Daemon, url_upstream
from tests.support.postgres import PgServer
from tests.support.servers import RunningServer

AHEAD_S = 600  # the other replica's clock, ahead of this host's


def approval(d: Daemon) -> str:
    return str(next(s["approval"] for s in d.status()["servers"] if s["name"] == "shared"))


def test_an_approval_after_a_decision_from_a_clock_ahead_holds_on_every_replica(
        tmp_path: Path, pg_server: PgServer, pg_url: str, spawn_server: object) -> None:
    srv: RunningServer = spawn_server("testserver", "http", ["--tools", "5"])  # type: ignore[operator]
    gated = dict(daemon_extra="require_approval = true\n")
    with replica(tmp_path, "a", pg_url, srv, **gated) as a, replica(tmp_path, "b", pg_url, srv, **gated) as b:
        with a.client() as c:
            assert c.request("toolatlas/upstream/approve", {"name": "shared"})["approval"] == "approved"
        b.wait_for(lambda: approval(b) == "active", 20, "B takes A's approval")
        # A third replica, its clock 10 minutes ahead, rejects the upstream.
        pg_server.psql(
            "UPDATE toolatlas_state SET body = body || jsonb_build_object('decision', 'rejected', 'by', 'ops-c', "
            f"'reason', 'rejected by the operator', 'changed_at', extract(epoch FROM now()) + {AHEAD_S}), "
            f"written_at = now() + interval '{AHEAD_S} seconds', origin = 'c:ahead', idem = 'c-reject', "
            "seq = nextval('toolatlas_state_seq') WHERE kind = 'approval' AND key = 'shared'",
            db=pg_url.rsplit("/", 1)[1])
        for d in (a, b):
            d.wait_for(lambda d=d: approval(d) == "rejected", 20, "the fast clock's rejection reaches A and B")
        # A minute later an operator approves it again on B: that is the decision in force, everywhere.
        with b.client() as c:
            assert c.request("toolatlas/upstream/approve", {"name": "shared"})["approval"] == "approved"
        a.wait_for(lambda: approval(a) == "active", 20, "A takes B's approval made after the rejection")
        assert approval(b) == "active"
    rows = pg_server.psql("SELECT body->>'decision' FROM toolatlas_state WHERE kind = 'approval' AND key = 'shared'",
                          db=pg_url.rsplit("/", 1)[1])
    assert rows == [("approved",)]


def test_a_retention_of_millions_of_days_does_not_stop_the_replica(tmp_path: Path, pg_url: str,
                                                                    spawn_server: object) -> None:
    """`[learning] retention_days` has no upper bound ("keep them for good"); the shared store's
    prune of events older than that reaches before the first timestamp PostgreSQL has (4713
    BC). The replica keeps serving and sharing, deleting nothing."""
    srv: RunningServer = spawn_server("testserver", "http", ["--tools", "5"])  # type: ignore[operator]
    (tmp_path / "a").mkdir()
    cfg = store_block(pg_url) + "[learning]\nretention_days = 1e9\n" + url_upstream("shared", "http", srv.url)
    with Daemon(tmp_path / "a", cfg).start() as a:
        a.wait_for(lambda: a.status()["store"]["connected"], 20, "A connects to the store")
        assert "shared__echo" in a.search("echo the message back", 5)
        out = a.tool("execute_tool", {"name": "shared__echo", "arguments": {"message": "hi"}})
        assert not out.get("isError"), out
        # the usage event goes out through the same loop that prunes, after the prune
        a.wait_for(lambda: a.status()["store"]["sent"] >= 1, 20, "A shares its usage event")
        assert a.proc is not None and a.proc.poll() is None
