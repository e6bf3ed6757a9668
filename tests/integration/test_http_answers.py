"""HTTP upstreams' answers that are not MCP, against the pool: a streamable-HTTP upstream's
error status, page of another Content-Type, body or event that is not JSON, an SSE stream that ends
before its endpoint event. Each is said as what came, with the status and the URL, on one
line; a session stays for the other calls."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from tests.integration.test_upstream_pool import Recorder, running, wait_status
from tests.support.configs import make_upstream
from tests.support.results import pool_call, text
from tests.support.servers import RunningServer, start_server
from toolatlas.config import Timeouts
from toolatlas.errors import UpstreamProtocolError, UpstreamTimeout
from toolatlas.upstream.pool import Pool
from toolatlas.upstream.state import UpstreamState


@pytest.fixture(scope="module")
def raw_http() -> Iterator[RunningServer]:
    srv = start_server("rawrpc", "http")
    try:
        yield srv
    finally:
        srv.stop()


async def test_a_wrong_url_s_404_is_said_as_an_http_404_at_that_url(raw_http: RunningServer) -> None:
    # It was "connect failed: JSON-RPC error -32601: Not Found": no status, no URL.
    url = raw_http.url.replace("/mcp", "/wrong")
    up = make_upstream("web", "http", url=url, ping_interval=0, relist_interval=0)
    with anyio.fail_after(60):
        async with running(Pool([up], Recorder(), backoff=lambda _a: 30.0)) as pool:
            st = await wait_status(pool, "web", lambda s: s.state is UpstreamState.DEGRADED)
    assert st.reason is not None and "\n" not in st.reason, st.reason
    assert f"the upstream answered HTTP 404 (Not Found) at {url}: 'Cannot POST /wrong'" in st.reason, st.reason


@pytest.mark.parametrize(("tool", "said"), [
    ("http_503", "the upstream answered HTTP 503 (Service Unavailable) at {url}: 'upstream overloaded, try later'"),
    ("http_html", "the upstream answered HTTP 200 at {url} with Content-Type text/html, not JSON-RPC: "
                  "'<html><body>Please log in</body></html>'"),
    ("not_json", "the upstream's response is not valid JSON-RPC: its body is not JSON"),
    ("event_not_json", "the upstream's response is not valid JSON-RPC: its event's data is not JSON"),
    # The SDK did not read an error status's body; reading all of one that never ends waited out the call.
    ("http_503_endless", "the upstream answered HTTP 503 (Service Unavailable) at {url}: "
                         + repr("<p>busy</p>\n" * 10)),
])
async def test_an_answer_that_is_not_json_rpc_fails_its_call_saying_what_came(
    raw_http: RunningServer, tool: str, said: str
) -> None:
    # They were "Server returned an error response", "Unexpected content type: text/html" and
    # pydantic's many-line report, each as if the upstream had sent that JSON-RPC error.
    up = make_upstream("web", "http", url=raw_http.url, ping_interval=0, relist_interval=0)
    with anyio.fail_after(60):
        async with running(Pool([up], Recorder())) as pool:
            await wait_status(pool, "web", lambda s: s.state is UpstreamState.READY)
            with pytest.raises(UpstreamProtocolError) as caught:
                await pool_call(pool, "web", tool, {})
            # toolatlas's words for what came, not said to be the upstream's JSON-RPC error
            assert str(caught.value) == (f"tools/call {tool} on upstream 'web' failed: "
                                         + said.format(url=raw_http.url)), caught.value
            assert pool.get("web").state is UpstreamState.READY  # type: ignore[union-attr]
            assert text(await pool_call(pool, "web", "echo", {"message": "after"})) == "Echo: after"


async def test_an_sse_stream_that_ends_before_its_endpoint_event_says_so() -> None:
    # It was "connect failed: RuntimeError: Child exited without calling task_status.started()".
    srv = start_server("rawrpc", "sse")
    try:
        url = srv.url.replace("/sse", "/ends")
        up = make_upstream("web", "sse", url=url, ping_interval=0, relist_interval=0)
        with anyio.fail_after(60):
            async with running(Pool([up], Recorder(), backoff=lambda _a: 30.0)) as pool:
                st = await wait_status(pool, "web", lambda s: s.state is UpstreamState.DEGRADED)
    finally:
        srv.stop()
    assert st.reason == f"connect failed: EOFError: the SSE stream at {url} ended before its endpoint event", st.reason


async def test_an_sse_message_post_that_fails_fails_its_call_at_once_and_the_session_goes_on() -> None:
    # The call waited out its timeout ("did not answer"), and the session's writer ended:
    # every later call failed as "JSON-RPC error -32000: Connection closed", READY all along.
    srv = start_server("rawrpc", "sse")
    try:
        up = make_upstream("web", "sse", url=srv.url, ping_interval=0, relist_interval=0,
                           timeouts=Timeouts(connect=15.0, list_tools=10.0, call=60.0, ping=5.0))
        with anyio.fail_after(40):
            async with running(Pool([up], Recorder())) as pool:
                await wait_status(pool, "web", lambda s: s.state is UpstreamState.READY)
                with pytest.raises(UpstreamProtocolError) as caught:
                    await pool_call(pool, "web", "http_503", {})
                endpoint = srv.url.replace("/sse", "/messages")
                assert str(caught.value) == (
                    "tools/call http_503 on upstream 'web' failed: the upstream answered "
                    f"HTTP 503 (Service Unavailable) at {endpoint}: 'upstream overloaded, try later'"), caught.value
                assert text(await pool_call(pool, "web", "echo", {"message": "after"})) == "Echo: after"
    finally:
        srv.stop()


async def test_a_server_that_answers_the_get_stream_with_404_keeps_its_session_on_a_tool_s_error() -> None:
    # A server that routes only POST answers the optional GET stream "404 Cannot GET /mcp".
    # That 404 carried the session id, so it counted as the session's expiry: the next
    # JSON-RPC error of any call (here an upstream's own -32000) ended the session, withdrew
    # its tools and reconnected, every time.
    srv = start_server("rawrpc", "http", "--sessions")
    try:
        up = make_upstream("web", "http", url=srv.url, ping_interval=0, relist_interval=0)
        with anyio.fail_after(60):
            async with running(Pool([up], Recorder(), mode="legacy")) as pool:
                await wait_status(pool, "web", lambda s: s.state is UpstreamState.READY)
                while text(await pool_call(pool, "web", "gets", {})) == "0":  # the SDK opened its GET stream
                    await anyio.sleep(0.05)
                with pytest.raises(UpstreamProtocolError, match="quota exceeded"):
                    await pool_call(pool, "web", "error32000", {"message": "quota exceeded"})
                st = pool.get("web")
                assert st is not None and st.state is UpstreamState.READY and st.reconnects == 0, st
                assert text(await pool_call(pool, "web", "echo", {"message": "after"})) == "Echo: after"
    finally:
        srv.stop()


async def test_calls_abandoned_before_their_answer_s_headers_do_not_exhaust_the_connection_pool(
    raw_http: RunningServer,
) -> None:
    # A tool that hangs without sending even its answer's headers: each call given up at its
    # timeout left its POST open until the 300 s read timeout, holding one of the client's
    # 100 pooled connections; at 100 every request of the session waited for one and the
    # session failed with "PoolTimeout", all its calls with it.
    up = make_upstream("web", "http", url=raw_http.url, ping_interval=0, relist_interval=0,
                       timeouts=Timeouts(connect=5.0, list_tools=10.0, call=20.0, ping=5.0))
    with anyio.fail_after(90):
        async with running(Pool([up], Recorder())) as pool:
            await wait_status(pool, "web", lambda s: s.state is UpstreamState.READY)
            for _ in range(4):
                async with anyio.create_task_group() as tg:
                    for _ in range(30):
                        tg.start_soon(_given_up, pool)
            assert text(await pool_call(pool, "web", "echo", {"message": "after"})) == "Echo: after"
            st = pool.get("web")
            assert st is not None and st.state is UpstreamState.READY and st.reconnects == 0, st
            while text(await pool_call(pool, "web", "open_streams", {})) != "0":  # the server saw them closed
                await anyio.sleep(0.05)


async def _given_up(pool: Pool) -> None:
    with pytest.raises(UpstreamTimeout, match="did not answer tools/call hang_silent within 0.5 s"):
        await pool_call(pool, "web", "hang_silent", {}, timeout=0.5)


async def test_more_calls_in_flight_than_the_http_client_s_default_pool_keep_the_session(
    raw_http: RunningServer,
) -> None:
    # max_concurrency = 120: 110 calls in flight held 110 connections of a client that had
    # 100, and the next request waited for one until the session failed with "PoolTimeout".
    up = make_upstream("web", "http", url=raw_http.url, ping_interval=0, relist_interval=0, max_concurrency=120,
                       timeouts=Timeouts(connect=2.0, list_tools=10.0, call=20.0, ping=5.0))
    with anyio.fail_after(90):
        async with running(Pool([up], Recorder())) as pool:
            await wait_status(pool, "web", lambda s: s.state is UpstreamState.READY)
            async with anyio.create_task_group() as tg:
                for _ in range(110):
                    tg.start_soon(_hung_for, pool, 8.0)
                while text(await pool_call(pool, "web", "open_streams", {})) != "110":
                    await anyio.sleep(0.05)
                assert text(await pool_call(pool, "web", "echo", {"message": "beside"})) == "Echo: beside"
            st = pool.get("web")
            assert st is not None and st.state is UpstreamState.READY and st.reconnects == 0, st


async def _hung_for(pool: Pool, seconds: float) -> None:
    with pytest.raises(UpstreamTimeout):
        await pool_call(pool, "web", "hang_silent", {}, timeout=seconds)


async def test_a_connection_dropped_before_its_answer_fails_that_call_not_the_session(raw_http: RunningServer) -> None:
    # "Server disconnected without sending a response" (a worker that died on one request, a
    # proxy's reset, a keep-alive connection the server had just closed) failed the call as the
    # upstream's "JSON-RPC error -32000: Connection closed", then took the whole session down.
    up = make_upstream("web", "http", url=raw_http.url, ping_interval=0, relist_interval=0)
    with anyio.fail_after(60):
        async with running(Pool([up], Recorder())) as pool:
            await wait_status(pool, "web", lambda s: s.state is UpstreamState.READY)
            with pytest.raises(UpstreamProtocolError) as caught:
                await pool_call(pool, "web", "drop", {})
            assert str(caught.value) == (
                "tools/call drop on upstream 'web' failed: the connection to upstream 'web' "
                "broke before its answer began (RemoteProtocolError: Server disconnected without sending a response.); "
                "the call may or may not have run"), caught.value
            assert text(await pool_call(pool, "web", "echo", {"message": "after"})) == "Echo: after"
            st = pool.get("web")
            assert st is not None and st.state is UpstreamState.READY and st.reconnects == 0, st
