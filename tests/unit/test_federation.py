"""The pure parts of federated resources and prompts (#16 item 5) and of the elicitation
relay (item 6): qualified URIs, template matching, our pagination cursors, parked calls, and
which call a 2025-era upstream's question is relayed to."""

from __future__ import annotations

import anyio
import mcp_types
import pytest

from toolatlas.errors import BadInput
from toolatlas.gateway.exchange import REQUEST_KEY, Exchange, Parked
from toolatlas.gateway.federation import paginate, qualify, template_matches, unqualify
from toolatlas.upstream.inbound import Inbound


def test_qualified_uris_keep_the_original_verbatim() -> None:
    for original in ("file:///etc/motd", "demo://resource/x?y=1#z", "test://item/{id}"):
        assert unqualify(qualify("beta", original)) == ("beta", original)
    assert unqualify("file:///etc/motd") is None
    assert unqualify("toolatlas://beta") is None and unqualify("toolatlas:///x") is None


def test_template_matching() -> None:
    assert template_matches("demo://resource/dynamic/text/{resourceId}", "demo://resource/dynamic/text/12")
    assert not template_matches("demo://resource/dynamic/text/{resourceId}", "demo://resource/dynamic/blob/12")
    assert not template_matches("demo://resource/dynamic/text/{resourceId}", "demo://resource/dynamic/text/")
    assert template_matches("file:///{path}", "file:///a/b.txt")
    assert template_matches("x://{a}/{b}", "x://1/2") and not template_matches("x://{a}/{b}", "x://1")
    assert template_matches("a.b://{x}", "a.b://q") and not template_matches("a.b://{x}", "aXb://q")


def _items(n: int) -> list[dict[str, object]]:
    return [{"uri": f"u://{i}"} for i in range(n)]


def test_pages_cover_the_list_once_and_a_stale_cursor_is_refused() -> None:
    items = _items(250)
    seen: list[object] = []
    cursor = None
    for _ in range(10):
        page = paginate(items, "uri", cursor, size=100)
        seen += [i["uri"] for i in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [i["uri"] for i in items]
    second = paginate(items, "uri", None, size=100).next_cursor
    assert second is not None
    with pytest.raises(BadInput, match="changed since"):
        paginate(items[:-1], "uri", second, size=100)
    with pytest.raises(BadInput, match="not issued by toolatlas"):
        paginate(items, "uri", "bm90IG91cnM", size=100)
    assert paginate([], "uri", None).items == [] and paginate([], "uri", None).next_cursor is None


async def test_a_parked_call_gets_its_answer_once() -> None:
    parked = Parked(ttl=30)
    ex = Exchange(ttl=30)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async def route() -> object:
                answer = await ex.ask({"message": "name?"})
                return answer["content"]["name"]

            tg.start_soon(ex.run, route)
            kind, params = await ex.next()
            assert kind == "ask" and params == {"message": "name?"}
            parked.park(ex)
            with pytest.raises(BadInput, match=REQUEST_KEY):
                parked.resume(ex.key, {"other": {}})
            resumed = parked.resume(ex.key, {REQUEST_KEY: mcp_types.ElicitResult(action="accept", content={"name": "Ada"})})
            assert await resumed.next() == ("done", "Ada")
            ex.close()
    with pytest.raises(BadInput, match="no longer waiting"):
        parked.resume(ex.key, {REQUEST_KEY: {}})


def _form() -> mcp_types.ElicitRequestFormParams:
    return mcp_types.ElicitRequestFormParams(message="name?", requested_schema={"type": "object", "properties": {}})


async def test_a_legacy_upstreams_question_goes_to_the_one_call_in_flight() -> None:
    inbound = Inbound("old")
    asked: list[str] = []

    async def relay(params: dict[str, object]) -> dict[str, object]:
        asked.append(str(params["message"]))
        return {"action": "accept", "content": {"name": "Ada"}}

    # The SDK runs a legacy server's request in its dispatcher task, started when the client
    # was entered: it has none of the call's context. So does this one.
    send, receive = anyio.create_memory_object_stream[anyio.Event](1)
    answers: list[object] = []

    async def dispatcher() -> None:
        async with receive:
            async for done in receive:
                answers.append(await inbound.elicit(None, _form()))  # type: ignore[arg-type]
                done.set()

    async def ask_from_dispatcher() -> object:
        done = anyio.Event()
        await send.send(done)
        await done.wait()
        return answers[-1]

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher)
            idle = await ask_from_dispatcher()
            assert isinstance(idle, mcp_types.ErrorData) and "no tools/call" in idle.message
            with inbound.call("ask", relay):
                one = await ask_from_dispatcher()
                assert isinstance(one, mcp_types.ElicitResult) and one.content == {"name": "Ada"}
                with inbound.call("other", relay):
                    two = await ask_from_dispatcher()
                    assert isinstance(two, mcp_types.ErrorData)
                    assert "2 calls were in flight" in two.message and "max_concurrency = 1" in two.message
            send.close()
    assert asked == ["name?"]


async def test_a_resources_list_changed_storm_tells_the_gateway_once_more_not_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The SDK hands each notification to its own task: 500 of them told every client 500
    # times, all at once, and wrote 500 log lines.
    import logging

    told: list[str] = []
    running = 0
    most = 0

    async def on_lists(server: str, kind: str) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await anyio.sleep(0.05)  # a fan-out to clients takes its time
        told.append(kind)
        running -= 1

    caplog.set_level(logging.INFO, logger="toolatlas.upstream.inbound")
    inbound = Inbound("stormy", on_lists=on_lists)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(500):
                tg.start_soon(inbound.message, mcp_types.ResourceListChangedNotification())
    assert told == ["resources", "resources"] and most == 1, (told, most)
    assert [r.getMessage() for r in caplog.records] == ["upstream stormy: resources/list_changed"]
    await inbound.message(mcp_types.ResourceListChangedNotification())  # a later change is told again
    assert told == ["resources"] * 3
