"""The daemon's map of 2025-era HTTP sessions (`surface.server.Connections`): bounded, and
what it pushes out is a session no one is using, never one a request is in flight on or one
its client used more recently than the others (the SDK keeps a session alive 30 minutes
after its last request; a session pushed out of this map loses its log level and what its
last tools/list showed, so its list changes and upstream log messages stop)."""

from __future__ import annotations

from toolatlas.gateway.ports import Connection
from toolatlas.surface.server import Connections


def _opened(conns: Connections, *ids: str) -> dict[str, Connection]:
    """Sessions opened in this order (each by its initialize request, then idle)."""
    made = {}
    for n, sid in enumerate(ids, start=1):
        conn = made[sid] = Connection(id=n)
        conns.add(conn)
        conns.remember(sid, conn)
        conns.discard(conn)
    return made


def test_a_session_its_client_keeps_using_outlives_abandoned_newer_ones() -> None:
    conns = Connections(max_sessions=3)
    made = _opened(conns, "kept", "abandoned-1", "abandoned-2")
    assert conns.session("kept") is made["kept"]  # its client's next request
    _opened(conns, "new")
    assert conns.session("kept") is made["kept"]
    assert conns.session("abandoned-1") is None
    assert len(conns.everyone()) == 3


def test_a_session_with_a_request_in_flight_is_not_pushed_out() -> None:
    conns = Connections(max_sessions=2)
    made = _opened(conns, "streaming", "idle")
    conns.add(made["streaming"])  # its GET event stream: one long request in flight
    _opened(conns, "new-1", "new-2")
    assert conns.session("streaming") is made["streaming"]
    assert conns.session("idle") is None and conns.session("new-1") is None
    assert len(conns.everyone()) == 2
    conns.discard(made["streaming"])
    _opened(conns, "new-3", "new-4")  # once nothing is in flight on it, it ages like the others
    assert conns.session("streaming") is None and conns.session("new-2") is None
    assert len(conns.everyone()) == 2
