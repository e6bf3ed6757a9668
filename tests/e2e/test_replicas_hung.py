"""A database host that does not answer (its PostgreSQL processes stopped: the kernel accepts
connections, nothing replies, as a hung host or a network that drops packets) while a replica
starts: the daemon serves at once and shares once the database answers. Real daemon, real
PostgreSQL (tests/support/postgres.py PgServer.pause)."""

from __future__ import annotations

from pathlib import Path

from tests.support.daemon import Daemon, url_upstream
from tests.support.postgres import PgServer
from tests.support.servers import RunningServer


def test_a_database_that_does_not_answer_does_not_hold_the_start(tmp_path: Path, pg_private: PgServer,
                                                                 spawn_server: object) -> None:
    srv: RunningServer = spawn_server("testserver", "http", ["--tools", "5"])  # type: ignore[operator]
    url = pg_private.new_database()
    store = f'[store]\nurl = "{url}"\nconnect_timeout = 120\nretry_interval = 0.2\ncatchup_interval = 0.5\n'
    (tmp_path / "a").mkdir()
    d = Daemon(tmp_path / "a", store + url_upstream("shared", "http", srv.url))
    pg_private.pause()
    try:
        # connect_timeout = 120: the store's first attempt is still waiting when search serves
        with d.start(wait_ready=45):
            st = d.status()["store"]
            assert st["connected"] is False and "no answer yet" in st["error"]
            assert "shared__echo" in d.search("echo the message back", 5)
            pg_private.resume()
            d.wait_for(lambda: d.status()["store"]["connected"], 60, "the replica connects once the database answers")
    finally:
        pg_private.resume()
