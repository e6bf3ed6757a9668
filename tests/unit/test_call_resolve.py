"""CallService between an upstream's first listing and its index swap.

The catalog's interim view holds the new records but keeps the server out of search until
the index has them. A call in that moment must reach the live session, not be refused with
"not available right now (ready)" (a race CI hit on a loaded machine)."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from toolatlas import events as ev
from toolatlas.calls import CallRequest, UpstreamCall, UpstreamReply
from toolatlas.catalog.attest import AttestResult
from toolatlas.catalog.model import ToolRecord
from toolatlas.errors import BadInput, UpstreamTimeout, UpstreamUnavailable
from toolatlas.gateway.calls import CallService
from toolatlas.gateway.ports import Connection
from toolatlas.gateway.view import CatalogView, plan_listing
from toolatlas.metrics import Metrics

TOOLS = [ToolRecord.make("fast", "echo", "Echo a message", {"type": "object"})]


def interim_view() -> CatalogView:
    verdict = AttestResult({t.tool: (t.description, "", ()) for t in TOOLS}, {}, "unattested")
    view = plan_listing(CatalogView(), "fast", TOOLS, verdict).interim
    assert "fast__echo" in view.by_name and not view.server("fast").available
    return view


def service(view: CatalogView, *, session_ready: bool, routed: list[UpstreamCall],
            route: Callable[[UpstreamCall], Awaitable[UpstreamReply]] | None = None) -> CallService:
    async def echo(call: UpstreamCall) -> UpstreamReply:
        routed.append(call)
        return UpstreamReply(payload={"content": [{"type": "text", "text": "Echo: early"}]})

    visibility: Any = SimpleNamespace(allowed_servers=lambda conn: {"fast"}, configured=lambda s: s == "fast")
    catalog: Any = SimpleNamespace(view=view, on_change=[])
    return CallService(
        catalog, visibility, route or echo, lambda s: "ready", metrics=Metrics(),
        events=ev.Events(io.StringIO()), session_ready=lambda s: session_ready,
    )


async def test_a_listed_tool_of_a_live_session_is_called_before_its_index_swap() -> None:
    routed: list[UpstreamCall] = []
    calls = service(interim_view(), session_ready=True, routed=routed)
    with anyio.fail_after(10):
        outcome = await calls.execute(CallRequest("fast__echo", {"message": "early"}), Connection(id=1))
    assert not outcome.is_error
    assert [(c.server, c.tool, c.arguments) for c in routed] == [("fast", "echo", {"message": "early"})]


async def test_a_server_whose_session_is_down_is_still_refused() -> None:
    routed: list[UpstreamCall] = []
    calls = service(interim_view(), session_ready=False, routed=routed)
    with anyio.fail_after(10), pytest.raises(UpstreamUnavailable, match="not available right now"):
        await calls.execute(CallRequest("fast__echo", {"message": "x"}), Connection(id=1))
    assert routed == []


async def test_a_drain_waits_for_the_calls_in_flight_and_no_longer() -> None:
    """`wait_idle` (the drain on shutdown) returns at once with no call in flight, waits for
    each call in flight to end, and gives up at its timeout while one hangs."""
    release = anyio.Event()

    async def route(call: UpstreamCall) -> UpstreamReply:
        await release.wait()
        return UpstreamReply(payload={"content": [{"type": "text", "text": "done"}]})

    visibility: Any = SimpleNamespace(allowed_servers=lambda conn: {"fast"}, configured=lambda s: s == "fast")
    view = plan_listing(CatalogView(), "fast", TOOLS, AttestResult({t.tool: (t.description, "", ()) for t in TOOLS},
                                                                     {}, "unattested")).final
    calls = CallService(SimpleNamespace(view=view, on_change=[]), visibility, route, lambda s: "ready",  # type: ignore[arg-type]
                        metrics=Metrics(), events=ev.Events(io.StringIO()))
    with anyio.fail_after(10):
        await calls.wait_idle(30)  # idle: returns at once (the fail_after above would say otherwise)
        drained: list[int] = []
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(calls.execute, CallRequest("fast__echo", {}), Connection(id=1))
            while calls.inflight < 2:
                await anyio.sleep(0.01)
            await calls.wait_idle(0.05)  # both still in flight: the timeout ends the wait
            assert calls.inflight == 2

            async def drain() -> None:
                await calls.wait_idle(30)
                drained.append(calls.inflight)

            tg.start_soon(drain)
            await anyio.sleep(0.05)
            assert drained == []  # still waiting for the two calls
            release.set()
        assert drained == [0]


@pytest.mark.parametrize("meta", ["tool_search", "catalog_status", "execute_tool"])
async def test_a_meta_tool_through_execute_tool_is_told_to_call_it_itself(meta: str) -> None:
    """It was "unknown tool 'tool_search'. Use tool_search to find tools.": a model that had
    just done that through execute_tool reads it as a loop."""
    routed: list[UpstreamCall] = []
    calls = service(interim_view(), session_ready=True, routed=routed)
    with anyio.fail_after(10), pytest.raises(BadInput) as caught:
        await calls.execute(CallRequest(meta, {}), Connection(id=1))
    assert str(caught.value) == (f"{meta} is one of the gateway's own tools, not an upstream's: call {meta} itself, "
                                 "not through execute_tool.")
    assert routed == []


@pytest.mark.parametrize("depth", [300, 100_000])
async def test_arguments_sent_as_a_deeply_nested_json_string_are_bad_input(depth: int) -> None:
    """The socket refuses a message nested over 200 levels, but `arguments` as a JSON string got
    past that: 100,000 levels made json.loads raise RecursionError (an internal error, with a
    traceback in the log), 300 reached the upstream call and failed there ("upstream 'x'
    failed ...: Maximum serialization depth exceeded", blaming the upstream)."""
    routed: list[UpstreamCall] = []
    calls = service(interim_view(), session_ready=True, routed=routed)
    deep = '{"message": "x", "extra": ' + "[" * depth + "]" * depth + "}"
    with anyio.fail_after(10), pytest.raises(BadInput, match="nests arrays and objects more than 200 levels deep"):
        await calls.execute(CallRequest("fast__echo", deep), Connection(id=1))
    shallow = '{"extra": ' + "[" * 150 + "]" * 150 + "}"
    with anyio.fail_after(10):
        await calls.execute(CallRequest("fast__echo", shallow), Connection(id=1))
    assert len(routed) == 1


async def test_a_call_that_timed_out_says_it_may_have_run() -> None:
    """"did not answer tools/call x within 60 s" read as "nothing happened": a model retried a
    call that may have sent the mail, made the payment."""
    calls = service(interim_view(), session_ready=True, routed=[], route=_timed_out)
    with anyio.fail_after(10), pytest.raises(UpstreamTimeout) as caught:
        await calls.execute(CallRequest("fast__echo", {}), Connection(id=1))
    assert str(caught.value) == ("upstream 'fast' did not answer tools/call echo within 2 s; it may still have run: "
                                 "call it again only if that is safe")
    assert str(UpstreamTimeout("fast", "tools/list", 2)) == "upstream 'fast' did not answer tools/list within 2 s"


async def _timed_out(call: UpstreamCall) -> UpstreamReply:
    raise UpstreamTimeout(call.server, f"tools/call {call.tool}", 2)


def test_a_server_between_its_listing_and_its_index_swap_is_said_to_be_indexing() -> None:
    """tool_search's note said "upstream 'fast' is not available right now (ready); try again
    later" for a server that had just listed its tools: ready is not a reason."""
    from toolatlas.gateway.status import StatusService
    from toolatlas.upstream.state import UpstreamState

    catalog: Any = SimpleNamespace(view=interim_view())
    pool: Any = SimpleNamespace(get=lambda name: SimpleNamespace(state=UpstreamState.READY, reason=None, since=0.0))
    status = StatusService(catalog, SimpleNamespace(), pool, SimpleNamespace(), SimpleNamespace(),  # type: ignore[arg-type]
                           index_ready=lambda: False)
    assert status.unsearchable("fast") == ("upstream 'fast' is connected and its tools are being indexed; "
                                           "search again in a moment")


async def test_the_name_index_of_a_server_a_reload_removed_is_let_go() -> None:
    """The "Did you mean" index built for a server stayed in memory (its tools with it) after
    a reload removed the server, for as long as the daemon ran."""
    calls = service(interim_view(), session_ready=True, routed=[])
    with anyio.fail_after(10), pytest.raises(BadInput, match="Did you mean: fast__echo"):
        await calls.execute(CallRequest("fast__ecco", {}), Connection(id=1))
    assert len(calls._name_indexes) == 1
    catalog: Any = calls._catalog
    catalog.view = CatalogView()  # the reload dropped "fast", then announced the change
    with anyio.fail_after(10):
        for listener in catalog.on_change:
            await listener()
    assert len(calls._name_indexes) == 0


async def test_a_call_parked_on_its_upstreams_question_ends_when_a_reload_withdraws_the_upstream() -> None:
    """A 2025-era upstream asked a 2026-07-28 caller a question mid-call: the call waits,
    parked, for the caller's retry with the answer. A reload that took the upstream from the
    caller left it waiting (the upstream's handler with it) for up to Parked.ttl (600 s);
    `withdraw` now ends it, as it ends the caller's calls in flight."""
    cancelled = anyio.Event()

    async def asking(call: UpstreamCall) -> UpstreamReply:
        assert call.elicit is not None
        try:
            await call.elicit({"message": "Which file?", "requestedSchema": {"type": "object", "properties": {}}})
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return UpstreamReply(payload={"content": [{"type": "text", "text": "done"}]})

    allowed = {"fast"}
    visibility: Any = SimpleNamespace(allowed_servers=lambda conn: set(allowed), configured=lambda s: s == "fast",
                                      permitted=lambda conn: set(allowed))
    view = plan_listing(CatalogView(), "fast", TOOLS, AttestResult({t.tool: (t.description, "", ()) for t in TOOLS},
                                                                     {}, "unattested")).final
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            calls = CallService(SimpleNamespace(view=view, on_change=[]), visibility, asking,  # type: ignore[arg-type]
                                lambda s: "ready", metrics=Metrics(), events=ev.Events(io.StringIO()),
                                asks_mid_call=lambda s: True, spawn=lambda: lambda fn: tg.start_soon(fn))
            outcome = await calls.execute(CallRequest("fast__echo", {}, allow_input_required=True), Connection(id=1))
            assert outcome.input_required is not None  # the question went to the caller; the call is parked
            allowed.clear()  # the reload: this caller may no longer use "fast"
            assert calls.withdraw("the daemon's access rules changed") == 1
            await cancelled.wait()


@pytest.mark.parametrize("last_error", [None, "the process exited with status 3 (stderr: boom)"])
def test_an_upstream_connecting_again_after_a_failure_says_why_the_last_attempt_failed(last_error: str | None) -> None:
    """A crash-looping upstream spends part of each backoff step connecting again: its note
    then said only "is starting (connecting for 0 s)", as for a first start, and dropped the
    failure a moment before it had quoted."""
    from toolatlas.gateway.status import StatusService
    from toolatlas.upstream.state import UpstreamState

    catalog: Any = SimpleNamespace(view=CatalogView())
    upstream = SimpleNamespace(state=UpstreamState.CONNECTING, reason=None, since=0.0, last_error=last_error)
    pool: Any = SimpleNamespace(get=lambda name: upstream)
    status = StatusService(catalog, SimpleNamespace(), pool, SimpleNamespace(), SimpleNamespace(),  # type: ignore[arg-type]
                           index_ready=lambda: False)
    note = status.unsearchable("bad")
    assert note.startswith("upstream 'bad' is starting (connecting for ") and "has not listed its tools yet" in note
    if last_error is None:
        assert "last attempt" not in note, note
    else:
        assert f"; its last attempt failed: {last_error}) and has not listed its tools yet" in note, note
