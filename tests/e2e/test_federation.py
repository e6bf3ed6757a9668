"""Resources, prompts, logging and elicitation through a real `toolatlas serve` (#16 items 5, 6).

Upstreams: npm's server-everything (MCP 2025-11-25: resources, templates, prompts, logging,
elicitation) and two of the project's test servers (2026-07-28) that both list
`shared://same`, `test://res/000..` and the template `test://item/{id}`, so their URIs collide;
`alpha` pages its 250 resources 40 at a time. Clients: the SDK's, over the Unix socket in both
protocol eras and over the HTTP endpoint with two bearer tokens, one of which may use `alpha`
only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.test_http_endpoint import ALL_TOKEN, ALPHA_TOKEN, http_section
from tests.support.daemon import Daemon, everything_upstream, stdio_testserver
from tests.support.ports import free_port
from tests.support.results import text as _text
from tests.support.servers import EVERYTHING_BIN
from toolatlas.surface.unix import unix_client

pytestmark = pytest.mark.skipif(not EVERYTHING_BIN.exists(), reason="npm server-everything is not installed")

ALPHA_RESOURCES = 250


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    port = free_port()
    upstreams = (http_section(port) + everything_upstream("everything")
                 + stdio_testserver("alpha", "--name", "alpha", "--resources", str(ALPHA_RESOURCES), "--page-size", "40")
                 + stdio_testserver("beta", "--name", "beta", "--resources", "2"))
    d = Daemon(tmp_path_factory.mktemp("fed"), upstreams)
    d.http_url = f"http://127.0.0.1:{port}/mcp"  # type: ignore[attr-defined]
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")
        yield d


@asynccontextmanager
async def _http(url: str, token: str) -> AsyncIterator[Any]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


async def _all(fetch: Any, field: str) -> tuple[list[Any], int]:
    """Every item of a paginated list, and how many pages it took."""
    items: list[Any] = []
    cursor: str | None = None
    for pages in range(1, 100):
        page = await fetch(cursor=cursor, cache_mode="bypass")
        items.extend(getattr(page, field))
        cursor = page.next_cursor
        if cursor is None:
            return items, pages
    raise AssertionError("the list did not end within 100 pages")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_lists_reads_and_prompts_over_the_socket(gw: Daemon, mode: str) -> None:
    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket), mode=mode) as c:
            assert c.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            caps = c.server_capabilities
            assert caps.resources is not None and caps.prompts is not None
            # resource updates are not relayed, so neither era is offered subscriptions
            assert not caps.resources.subscribe
            resources, pages = await _all(c.list_resources, "resources")
            uris = [str(r.uri) for r in resources]
            assert len(uris) == len(set(uris)), "no URI listed twice"
            assert pages >= 3  # ~260 resources, 100 a page: our own pagination
            # alpha's upstream pages (40 a page) were all followed
            assert {f"test://res/{i:03d}" for i in range(2, ALPHA_RESOURCES)} <= set(uris)
            # colliding URIs are qualified with the server's name, the others kept as they are
            for server in ("alpha", "beta"):
                assert f"toolatlas://{server}/shared://same" in uris
                assert f"toolatlas://{server}/test://res/000" in uris
            assert "shared://same" not in uris and "test://res/000" not in uris
            demo = [u for u in uris if u.startswith("demo://resource/static/document/")]
            assert demo, uris[:20]

            templates, _ = await _all(c.list_resource_templates, "resource_templates")
            shapes = {t.uri_template for t in templates}
            assert {"toolatlas://alpha/test://item/{id}", "toolatlas://beta/test://item/{id}"} <= shapes
            assert any(s.startswith("demo://resource/dynamic/text/") for s in shapes), shapes

            prompts, _ = await _all(c.list_prompts, "prompts")
            names = {p.name for p in prompts}
            assert {"everything__simple-prompt", "everything__args-prompt", "alpha__greet", "beta__greet"} <= names

            got = await c.get_prompt("everything__args-prompt", {"city": "Lisbon"})
            assert "Lisbon" in str(got.messages[0].content)
            greet = await c.get_prompt("beta__greet", {"name": "Ada"})
            assert "Ada" in str(greet.messages[0].content)

            doc = await c.read_resource(demo[0])
            assert doc.contents and str(doc.contents[0].uri) == demo[0]
            beta = await c.read_resource("toolatlas://beta/shared://same")
            assert beta.contents[0].text == "shared resource of beta"  # type: ignore[union-attr]
            assert str(beta.contents[0].uri) == "toolatlas://beta/shared://same"
            plain = await c.read_resource("test://res/123")  # listed by alpha alone
            assert plain.contents[0].text == "resource 123"  # type: ignore[union-attr]
            templated = await c.read_resource("toolatlas://alpha/test://item/42")
            assert templated.contents[0].text == "item 42 of alpha"  # type: ignore[union-attr]

            with pytest.raises(MCPError) as ambiguous:
                await c.read_resource("shared://same")
            assert ambiguous.value.error.code == types.INVALID_PARAMS
            assert "toolatlas://alpha/shared://same or toolatlas://beta/shared://same" in ambiguous.value.error.message
            with pytest.raises(MCPError) as unknown:
                await c.read_resource("nowhere://at/all")
            assert unknown.value.error.code == -32002 and "nowhere://at/all" in unknown.value.error.message
            with pytest.raises(MCPError) as no_prompt:
                await c.get_prompt("alpha__nope")
            assert no_prompt.value.error.code == types.INVALID_PARAMS and "alpha__nope" in no_prompt.value.error.message


async def test_a_stale_cursor_is_refused(gw: Daemon) -> None:
    with anyio.fail_after(30):
        async with Client(unix_client(gw.socket), mode="legacy") as c:
            first = await c.list_resources(cache_mode="bypass")
            assert first.next_cursor
            with pytest.raises(MCPError) as foreign:
                await c.list_resources(cursor="not-ours", cache_mode="bypass")
            assert foreign.value.error.code == types.INVALID_PARAMS and "list again" in foreign.value.error.message


async def test_resource_links_returned_by_tools_can_be_read(gw: Daemon) -> None:
    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket)) as c:
            links = await c.call_tool("execute_tool", {"name": "everything__get-resource-links",
                                                       "arguments": {"count": 2}})
            uris = [str(b.uri) for b in links.content if isinstance(b, types.ResourceLink)]
            assert len(uris) == 2, links
            for uri in uris:  # demo://resource/dynamic/...: template-made, not in resources/list
                read = await c.read_resource(uri)
                assert read.contents and str(read.contents[0].uri) == uri
            # test://item/{id} is a template of both alpha and beta: the link says it is alpha's
            linked = await c.call_tool("alpha__link", {"name": "q7"})
            (link,) = [b for b in linked.content if isinstance(b, types.ResourceLink)]
            read = await c.read_resource(str(link.uri))
            assert read.contents[0].text == "item q7 of alpha"  # type: ignore[union-attr]
            with pytest.raises(MCPError) as ambiguous:
                await c.read_resource("test://item/never-linked")
            assert "toolatlas://alpha/test://item/never-linked" in ambiguous.value.error.message


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_tokens_see_only_the_servers_they_may_use(gw: Daemon, mode: str) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    with anyio.fail_after(60):
        async with Client(_http(url, ALL_TOKEN), mode=mode) as ops:
            ops_uris = {str(r.uri) for r in (await _all(ops.list_resources, "resources"))[0]}
            assert any(u.startswith("demo://") for u in ops_uris)
            doc = sorted(u for u in ops_uris if u.startswith("demo://resource/static/"))[0]
            assert (await ops.read_resource(doc)).contents
            assert (await ops.get_prompt("everything__simple-prompt")).messages
        async with Client(_http(url, ALPHA_TOKEN), mode=mode) as alpha:
            uris = {str(r.uri) for r in (await _all(alpha.list_resources, "resources"))[0]}
            # only alpha's, and with beta out of sight nothing collides: all plain
            assert "test://res/000" in uris and "shared://same" in uris
            assert not [u for u in uris if u.startswith(("demo://", "toolatlas://"))], sorted(uris)[:5]
            templates = {t.uri_template for t in (await _all(alpha.list_resource_templates, "resource_templates"))[0]}
            assert templates == {"test://item/{id}"}
            assert {p.name for p in (await _all(alpha.list_prompts, "prompts"))[0]} == {"alpha__greet"}
            with pytest.raises(MCPError) as hidden:
                await alpha.read_resource(doc)
            with pytest.raises(MCPError) as missing:
                await alpha.read_resource("demo://resource/static/document/no-such-file.md")
            # a hidden server's resource reads exactly like one that does not exist (here both
            # go to alpha, the only server this token may read from, which knows neither)
            assert hidden.value.error.code == missing.value.error.code
            assert (hidden.value.error.message.replace(doc, "X")
                    == missing.value.error.message.replace("demo://resource/static/document/no-such-file.md", "X"))
            with pytest.raises(MCPError) as qualified:
                await alpha.read_resource("toolatlas://beta/shared://same")
            assert qualified.value.error.code == -32002
            with pytest.raises(MCPError) as prompt:
                await alpha.get_prompt("everything__simple-prompt")
            assert "unknown prompt" in prompt.value.error.message and "everything" not in prompt.value.error.message.replace(
                "everything__simple-prompt", "")
            assert (await alpha.get_prompt("alpha__greet", {"name": "Bo"})).messages


async def test_list_changed_reaches_both_eras(gw: Daemon) -> None:
    legacy_changes: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceListChangedNotification):
            legacy_changes.append("resources")

    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket), mode="legacy", message_handler=on_message) as old, \
                Client(unix_client(gw.socket)) as new:
            await old.list_resources()  # a session that has seen the list
            async with new.listen(resources_list_changed=True, prompts_list_changed=True) as sub:
                # a 2026-07-28 upstream announces on its listen stream
                await new.call_tool("alpha__add_resource", {"name": "fresh"})
                async for event in sub:
                    if type(event).__name__ == "ResourcesListChanged":
                        break
                while not legacy_changes:
                    await anyio.sleep(0.05)
                uris = {str(r.uri) for r in (await _all(new.list_resources, "resources"))[0]}
                assert "test://res/fresh" in uris
                # a 2025-11-25 upstream announces with a notification (a session resource)
                legacy_changes.clear()
                made = await old.call_tool("execute_tool", {"name": "everything__gzip-file-as-resource", "arguments": {
                    "name": "hello.txt.gz", "data": "data:text/plain;base64,aGVsbG8=", "outputType": "resourceLink"}})
                assert not made.is_error, made
                async for event in sub:
                    if type(event).__name__ == "ResourcesListChanged":
                        break
                while not legacy_changes:
                    await anyio.sleep(0.05)
                uris = {str(r.uri) for r in (await _all(old.list_resources, "resources"))[0]}
                assert "demo://resource/session/hello.txt.gz" in uris
                read = await old.read_resource("demo://resource/session/hello.txt.gz")
                assert isinstance(read.contents[0], types.BlobResourceContents)


async def test_log_messages_reach_each_client_at_its_level(gw: Daemon) -> None:
    got: dict[str, list[types.LoggingMessageNotificationParams]] = {"debug": [], "error": []}

    def collect(level: str) -> Any:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            got[level].append(params)
        return on_log

    async def set_level(c: Client, level: str) -> None:
        # The request itself: Client.set_logging_level warns that logging is deprecated in 2026-07-28.
        await c.session.send_request(
            types.SetLevelRequest(params=types.SetLevelRequestParams(level=level)), types.EmptyResult)  # type: ignore[arg-type]

    with anyio.fail_after(90):
        async with Client(unix_client(gw.socket), mode="legacy", logging_callback=collect("debug")) as verbose, \
                Client(unix_client(gw.socket), mode="legacy", logging_callback=collect("error")) as quiet:
            await set_level(verbose, "debug")
            await set_level(quiet, "error")
            started = await verbose.call_tool("execute_tool", {"name": "everything__toggle-simulated-logging"})
            assert "Started" in _text(started), started
            try:
                severe = {"error", "critical", "alert", "emergency"}
                # a random level every 5 s: wait until the verbose client saw both kinds
                while not (any(p.level not in severe for p in got["debug"]) and any(p.level in severe for p in got["debug"])):
                    await anyio.sleep(0.1)
            finally:
                stopped = await verbose.call_tool("execute_tool", {"name": "everything__toggle-simulated-logging"})
                assert "Stopped" in _text(stopped)
            await anyio.sleep(0.5)  # the last severe one on its way to the quiet client
            assert all(p.logger == "everything" or str(p.logger).startswith("everything/") for p in got["debug"])
            assert got["error"], "the quiet client got the severe messages"
            assert {p.level for p in got["error"]} <= severe
            assert len(got["error"]) < len(got["debug"])


async def answer_form(ctx: object, params: types.ElicitRequestParams) -> types.ElicitResult:
    assert params.message
    return types.ElicitResult(action="accept", content={"name": "Ada Lovelace", "check": True, "email": "ada@example.org",
                                                        "firstLine": "It was", "integer": 3, "number": 1.5})


async def test_elicitation_is_relayed_to_a_legacy_client(gw: Daemon) -> None:
    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket), mode="legacy", elicitation_callback=answer_form) as c:
            # a 2025-11-25 upstream asks with elicitation/create mid-call
            result = await c.call_tool("execute_tool", {"name": "everything__trigger-elicitation-request"})
            assert not result.is_error, result
            assert "Ada Lovelace" in _text(result)
            # a 2026-07-28 upstream answers input_required; toolatlas asks the legacy client
            greeted = await c.call_tool("alpha__greet_user", {})
            assert _text(greeted).startswith("Hello, Ada Lovelace!"), greeted


async def test_elicitation_errors_name_the_side_that_cannot_relay(gw: Daemon) -> None:
    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket), mode="legacy") as mute:  # no elicitation capability
            refused = await mute.call_tool("everything__trigger-elicitation-request", {})
            assert refused.is_error
            assert "did not declare the elicitation capability" in _text(refused), _text(refused)
            assert "everything" in _text(refused)
        async with Client(unix_client(gw.socket)) as modern_mute:
            assert modern_mute.protocol_version == "2026-07-28"
            refused = await modern_mute.call_tool("everything__trigger-elicitation-request", {})
            assert "did not declare the elicitation capability" in _text(refused), _text(refused)


async def test_a_legacy_upstreams_question_reaches_a_2026_client_as_input_required(gw: Daemon) -> None:
    asked: list[str] = []

    async def answer(ctx: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return await answer_form(ctx, params)

    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket), elicitation_callback=answer) as c:
            assert c.protocol_version == "2026-07-28"
            # by hand: the round the SDK's driver does for Client.call_tool
            first = await c.session.call_tool("everything__trigger-elicitation-request", {}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult) and first.request_state, first
            (key,) = first.input_requests
            done = await c.session.call_tool(
                "everything__trigger-elicitation-request", {}, allow_input_required=True,
                input_responses={key: types.ElicitResult(action="accept", content={"name": "Grace Hopper", "check": True,
                                                                                  "email": "g@example.org"})},
                request_state=first.request_state)
            assert isinstance(done, types.CallToolResult) and "Grace Hopper" in _text(done), done
            # a replayed state finds nothing parked any more
            again = await c.session.call_tool(
                "everything__trigger-elicitation-request", {}, allow_input_required=True,
                input_responses={key: types.ElicitResult(action="decline")}, request_state=first.request_state)
            assert isinstance(again, types.CallToolResult) and again.is_error and "already used" in _text(again)
            # and through the SDK's own driver, via execute_tool
            via_meta = await c.call_tool("execute_tool", {"name": "everything__trigger-elicitation-request"})
            assert "Ada Lovelace" in _text(via_meta), via_meta
            assert asked and "Please provide inputs" in asked[0]


async def test_a_retry_that_leaves_the_question_unanswered_keeps_its_state_good(gw: Daemon) -> None:
    """A retry whose inputResponses miss the parked question is told which key to answer; the
    retry that does so, with the same requestState, reaches the waiting upstream call."""

    async def unused(ctx: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("the rounds are driven by hand here")

    answer = types.ElicitResult(action="accept", content={"name": "Grace Hopper", "check": True,
                                                           "email": "g@example.org"})
    tool = "everything__trigger-elicitation-request"
    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket), elicitation_callback=unused) as c:
            first = await c.session.call_tool(tool, {}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult) and first.request_state, first
            (key,) = first.input_requests
            missed = await c.session.call_tool(tool, {}, allow_input_required=True, input_responses={"other": answer},
                                               request_state=first.request_state)
            assert isinstance(missed, types.CallToolResult) and missed.is_error, missed
            assert f"must answer {key!r}" in _text(missed), _text(missed)
            done = await c.session.call_tool(tool, {}, allow_input_required=True, input_responses={key: answer},
                                             request_state=first.request_state)
            assert isinstance(done, types.CallToolResult) and "Grace Hopper" in _text(done), _text(done)
            # answered once, the state is spent
            again = await c.session.call_tool(tool, {}, allow_input_required=True, input_responses={key: answer},
                                              request_state=first.request_state)
            assert isinstance(again, types.CallToolResult) and "already used" in _text(again), _text(again)


async def test_over_http_questions_and_changes_reach_both_eras(gw: Daemon) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    with anyio.fail_after(60):
        async with Client(_http(url, ALL_TOKEN), mode="legacy", elicitation_callback=answer_form) as old:
            # elicitation/create rides the POST's event stream of the call it belongs to
            result = await old.call_tool("execute_tool", {"name": "everything__trigger-elicitation-request"})
            assert "Ada Lovelace" in _text(result), result
        async with Client(_http(url, ALPHA_TOKEN), elicitation_callback=answer_form) as new:
            assert new.protocol_version == "2026-07-28"
            greeted = await new.call_tool("alpha__greet_user", {})
            assert _text(greeted).startswith("Hello, Ada Lovelace!"), greeted
            async with new.listen(resources_list_changed=True) as sub:
                await new.call_tool("alpha__add_resource", {"name": "over-http"})
                async for event in sub:
                    if type(event).__name__ == "ResourcesListChanged":
                        break
            uris = {str(r.uri) for r in (await _all(new.list_resources, "resources"))[0]}
            assert "test://res/over-http" in uris


async def test_a_2026_client_gets_the_log_messages_of_its_own_call(gw: Daemon) -> None:
    got: list[types.LoggingMessageNotificationParams] = []
    other: list[types.LoggingMessageNotificationParams] = []

    async def collect(params: types.LoggingMessageNotificationParams) -> None:
        got.append(params)

    async def collect_other(params: types.LoggingMessageNotificationParams) -> None:
        other.append(params)

    with anyio.fail_after(60):
        async with Client(unix_client(gw.socket), log_level="warning", logging_callback=collect) as new, \
                Client(unix_client(gw.socket), mode="legacy", logging_callback=collect_other) as old:
            await old.session.send_request(
                types.SetLevelRequest(params=types.SetLevelRequestParams(level="debug")), types.EmptyResult)
            done = await new.call_tool("alpha__log_at", {"levels": ["debug", "info", "warning", "error"]})
            assert _text(done) == "logged 4", done
            assert [(p.level, p.logger, p.data) for p in got] == [
                ("warning", "alpha/test", "warning message"), ("error", "alpha/test", "error message")]
            await old.list_prompts(cache_mode="bypass")  # anything sent to it before now has arrived
            # a 2026-07-28 upstream's log messages belong to the request that asked for them
            assert not [p for p in other if str(p.logger).startswith("alpha")], other
            # ... so a 2025-era caller's own call asks for them at its logging/setLevel level
            await old.call_tool("execute_tool", {"name": "alpha__log_at", "arguments": {"levels": ["debug", "error"]}})
            await old.list_prompts(cache_mode="bypass")
            assert [(p.level, p.data) for p in other if str(p.logger).startswith("alpha")] == [
                ("debug", "debug message"), ("error", "error message")], other


async def test_a_legacy_http_session_gets_changes_and_log_messages_between_requests(gw: Daemon) -> None:
    """A 2025-11-25 HTTP session's requests share one connection: its log level holds, and
    notifications reach its standalone event stream while no request is in flight."""
    changes: list[str] = []
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceListChangedNotification):
            changes.append("resources")

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    url = gw.http_url  # type: ignore[attr-defined]
    with anyio.fail_after(60):
        async with Client(_http(url, ALL_TOKEN), mode="legacy", message_handler=on_message,
                          logging_callback=on_log) as c, Client(unix_client(gw.socket)) as other:
            await c.session.send_request(
                types.SetLevelRequest(params=types.SetLevelRequestParams(level="debug")), types.EmptyResult)
            await c.list_resources()
            # another client changes alpha's resources: the session hears it on its own stream
            await other.call_tool("alpha__add_resource", {"name": "heard-over-http"})
            while not changes:
                await anyio.sleep(0.05)
            started = await other.call_tool("execute_tool", {"name": "everything__toggle-simulated-logging"})
            try:
                while not logs:
                    await anyio.sleep(0.05)
            finally:
                await other.call_tool("execute_tool", {"name": "everything__toggle-simulated-logging"})
            assert "Started" in _text(started)
            assert str(logs[0].logger).startswith("everything")
