"""`Sharing` and `toolatlas learning forget|reset` through the shared store: a replica deletes
its copies when the forget event comes, and drops the forgotten tool's events recorded before
it that reach it later (another replica's buffer, sent after the forget). Sharing is the unit
under test; its gateway and replica are small fakes (the real path: tests/e2e/test_replicas)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from toolatlas.retrieval.usage import UsageEvent
from toolatlas.store.ports import FEEDBACK, FEEDBACK_FORGET, Change
from toolatlas.store.wiring import Sharing


class FakeReplica:
    origin = "here"

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}
        self.appended: list[tuple[str, str, dict[str, Any]]] = []

    def subscribe(self, kind: str, handler: Any) -> None:
        self.handlers[kind] = handler

    async def append(self, kind: str, key: str, body: dict[str, Any]) -> None:
        self.appended.append((kind, key, body))


def _sharing() -> tuple[Sharing, FakeReplica, list[UsageEvent], list[tuple[str | None, float]]]:
    ingested: list[UsageEvent] = []
    forgotten: list[tuple[str | None, float]] = []

    async def ingest(event: UsageEvent) -> bool:
        ingested.append(event)
        return True

    async def forget(tool: str | None, until: float) -> int:
        forgotten.append((tool, until))
        return 1

    gw = SimpleNamespace(
        approvals=SimpleNamespace(on_decided=[]), catalog=SimpleNamespace(on_change=[], view=SimpleNamespace(servers={})),
        learning=SimpleNamespace(on_recorded=[], ingest=ingest, forget=forget),
        events=SimpleNamespace(audit=None), status_service=SimpleNamespace(sections={}))
    replica = FakeReplica()
    return Sharing(gw, replica), replica, ingested, forgotten  # type: ignore[arg-type]


def _feedback(tool: str, at: float) -> Change:
    return Change("events", FEEDBACK, tool, {"query": "q", "tool": tool, "principal": "uid:1", "at": at,
                                             "index_version": 1}, "other", 1)


async def test_a_forget_deletes_here_and_drops_late_events_of_that_tool_only() -> None:
    sharing, replica, ingested, forgotten = _sharing()
    await replica.handlers[FEEDBACK_FORGET](Change("events", FEEDBACK_FORGET, "fs__read", {"tool": "fs__read", "until": 100.0},
                                                   "cli:host:1", 2))
    assert forgotten == [("fs__read", 100.0)]
    for tool, at in (("fs__read", 99.0), ("fs__read", 100.0), ("fs__read", 101.0), ("fs__list", 50.0)):
        await replica.handlers[FEEDBACK](_feedback(tool, at))
    assert [(e.tool, e.at) for e in ingested] == [("fs__read", 101.0), ("fs__list", 50.0)]
    # a reset ("*") covers every tool up to its moment; a malformed one changes nothing
    await replica.handlers[FEEDBACK_FORGET](Change("events", FEEDBACK_FORGET, "*", {"tool": None, "until": 60.0}, "cli", 3))
    await replica.handlers[FEEDBACK_FORGET](Change("events", FEEDBACK_FORGET, "*", {"tool": 5, "until": 1e12}, "cli", 4))
    assert forgotten[-1] == (None, 60.0) and len(forgotten) == 2
    ingested.clear()
    await replica.handlers[FEEDBACK](_feedback("fs__list", 59.0))
    await replica.handlers[FEEDBACK](_feedback("fs__list", 61.0))
    assert [e.at for e in ingested] == [61.0]


async def test_a_local_event_from_before_the_forget_is_not_shared() -> None:
    """An event recorded here just before the forget, not yet written to the buffer, is not
    sent out to be learned again."""
    sharing, replica, _, _ = _sharing()
    await replica.handlers[FEEDBACK_FORGET](Change("events", FEEDBACK_FORGET, "fs__read", {"tool": "fs__read", "until": 100.0},
                                                   "cli", 2))
    for at in (99.0, 101.0):
        sharing._feedback_recorded(UsageEvent(query="q", tool="fs__read", principal="uid:1", at=at, index_version=1))
    await sharing._sync()
    assert [(kind, body["at"]) for kind, _, body in replica.appended] == [(FEEDBACK, 101.0)]


async def test_an_event_from_a_clock_ahead_is_dated_now_here() -> None:
    """A replica whose clock runs a year ahead: its usage events were kept here a year past
    `retention` (pruning goes by their time), at full weight all the while. Dated now here;
    one with no usable time is dropped."""
    import math
    import time

    _, replica, ingested, _ = _sharing()
    before = time.time()
    await replica.handlers[FEEDBACK](_feedback("fs__read", before + 365 * 86400.0))
    await replica.handlers[FEEDBACK](_feedback("fs__list", 1000.0))  # the past stays as it was
    for bad in (math.inf, math.nan):
        await replica.handlers[FEEDBACK](_feedback("fs__bad", bad))
    assert [e.tool for e in ingested] == ["fs__read", "fs__list"]
    assert before <= ingested[0].at <= time.time() and ingested[1].at == 1000.0
