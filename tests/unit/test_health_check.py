"""The health check and the re-list of a ready session (upstream/supervision.py): a check or
re-list left unanswered loses an idle session at once, but one with calls in flight only at
the second in a row, since a server busy with a large result answers nothing else meanwhile
(CI saw a 50 MB result's call fail with the session a health check ended under it).

Supervision's health loop and re-list worker against a fake session and a fake client whose
requests hang or answer as each test says; the unit under test is the loop itself."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types
import pytest

from tests.support.configs import make_upstream
from toolatlas.config import Timeouts
from toolatlas.upstream.client import Loss, LossReason
from toolatlas.upstream.supervision import Supervision

UP = make_upstream("busy", "http", url="http://127.0.0.1:9/mcp", ping_interval=0.01, relist_interval=0,
                   timeouts=Timeouts(connect=1.0, list_tools=2.0, call=1.0, ping=0.05))
# list_tools: an answered re-list still converts its page in a worker thread, inside the
# timeout; 2 s leaves a loaded machine room for that hop (a hanging one costs 2 s a try).


class FakeSession:
    """What Supervision reads of a connection (supervision.Supervised), recording losses."""

    name = "busy"
    upstream = UP
    tools = None

    def __init__(self) -> None:
        self.losses: list[Loss] = []
        self.published: list[list[Any] | None] = []

    def mark_lost(self, loss: Loss) -> None:
        self.losses.append(loss)

    def describe(self, exc: BaseException) -> str:
        return repr(exc)

    async def publish(self, tools: list[Any] | None) -> None:
        self.published.append(tools)


class Checks:
    """A client whose n-th health check (server/discover) answers when `answers(n)` says so,
    else never (so the check times out)."""

    protocol_version = "2026-07-28"

    def __init__(self, answers: Any) -> None:
        self.answers = answers
        self.sent = 0
        self.session = self

    async def send_discover(self, version: str) -> None:
        self.sent += 1
        if not self.answers(self.sent):
            await anyio.sleep_forever()

    async def list_tools(self, cursor: str | None = None, cache_mode: str = "") -> mcp_types.ListToolsResult:
        self.sent += 1
        if not self.answers(self.sent):
            await anyio.sleep_forever()
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(name="t", input_schema={"type": "object"})])


async def run_checks(answers: Any, in_flight: Any, until: Any, *, relist: bool = False) -> tuple[FakeSession, Checks]:
    """The health loop (or with `relist`, the re-list worker, asked for one re-list) until
    `until(session, client)` holds or the loop ends (it returns once it marked the session lost)."""
    s, client = FakeSession(), Checks(answers)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def loop() -> None:
                sup = Supervision(s, in_flight=in_flight)  # type: ignore[arg-type]
                if relist:
                    sup.want_relist()
                    await sup._relist_worker(client)  # type: ignore[arg-type]
                else:
                    await sup._health_loop(client, True)  # type: ignore[arg-type]
                tg.cancel_scope.cancel()

            tg.start_soon(loop)
            while not until(s, client):
                await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    return s, client


@pytest.mark.timeout(60)
async def test_an_idle_session_is_lost_at_the_first_unanswered_check() -> None:
    s, client = await run_checks(lambda n: n > 1, lambda: 0, lambda s, c: s.losses)
    assert client.sent == 1
    assert [x.reason for x in s.losses] == [LossReason.HEALTH_CHECK]
    assert "did not answer server/discover (health check) within 0.05 s" in s.losses[0].text, s.losses[0].text


@pytest.mark.timeout(60)
async def test_a_busy_session_is_lost_only_at_the_second_unanswered_check_in_a_row() -> None:
    s, client = await run_checks(lambda n: False, lambda: 2, lambda s, c: s.losses)
    assert client.sent == 2 and [x.reason for x in s.losses] == [LossReason.HEALTH_CHECK]


@pytest.mark.timeout(60)
async def test_an_answered_check_clears_the_excuse() -> None:
    # Checks 1, 3, 5, ... go unanswered while calls are in flight, each followed by one that
    # answers: never two in a row, so the session is never lost.
    s, client = await run_checks(lambda n: n % 2 == 0, lambda: 1, lambda s, c: s.losses or c.sent >= 9)
    assert s.losses == [] and client.sent >= 9


@pytest.mark.timeout(60)
async def test_calls_ending_meanwhile_make_the_next_miss_count() -> None:
    # Busy at the first miss (excused), idle at the second: lost then.
    state = {"busy": 1}

    def answers(n: int) -> bool:
        if n == 2:
            state["busy"] = 0
        return False

    s, client = await run_checks(answers, lambda: state["busy"], lambda s, c: s.losses)
    assert client.sent == 2 and [x.reason for x in s.losses] == [LossReason.HEALTH_CHECK]


@pytest.mark.timeout(60)
async def test_a_relist_timing_out_loses_an_idle_session() -> None:
    s, client = await run_checks(lambda n: False, lambda: 0, lambda s, c: s.losses, relist=True)
    assert client.sent == 1 and [x.reason for x in s.losses] == [LossReason.TIMEOUT]
    assert "tools/list" in s.losses[0].text and s.published == [], s.losses[0].text


@pytest.mark.timeout(60)
async def test_a_relist_timing_out_while_busy_is_tried_again_at_once_and_twice_loses() -> None:
    s, client = await run_checks(lambda n: False, lambda: 3, lambda s, c: s.losses, relist=True)
    assert client.sent == 2 and [x.reason for x in s.losses] == [LossReason.TIMEOUT]


@pytest.mark.timeout(60)
async def test_a_relist_answered_at_the_second_try_publishes_the_list() -> None:
    s, client = await run_checks(lambda n: n == 2, lambda: 1, lambda s, c: s.published, relist=True)
    assert client.sent == 2 and s.losses == []
    assert [[r.tool for r in tools or ()] for tools in s.published] == [["t"]]
