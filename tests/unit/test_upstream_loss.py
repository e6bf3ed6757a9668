"""Upstream failure classification and the Tool -> ToolRecord converter, on real exception
and SDK instances; no process, no socket."""

from __future__ import annotations

from typing import Any

import anyio
import httpx2
import mcp_types
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from toolatlas.errors import UpstreamProtocolError, UpstreamUnavailable
from toolatlas.config import HttpUpstream
from toolatlas.upstream.client import STAND_IN, AuthWatch, LossReason, call_error, classify, describe
from toolatlas.upstream.listing import record_from_tool
from toolatlas.upstream.transports import _response_hook

URL = "http://127.0.0.1:9/mcp"


def _validation_error() -> ValidationError:
    try:
        mcp_types.CallToolResult.model_validate({"content": 5})
    except ValidationError as exc:
        return exc
    raise AssertionError("the payload was expected to be invalid")


def _request() -> httpx2.Request:
    return httpx2.Request("POST", URL)


CASES: list[tuple[BaseException, LossReason]] = [
    (httpx2.ConnectError("All connection attempts failed", request=_request()), LossReason.TRANSPORT),
    (httpx2.ReadError("connection reset", request=_request()), LossReason.TRANSPORT),
    (httpx2.RemoteProtocolError("Server disconnected without sending a response.", request=_request()),
     LossReason.TRANSPORT),
    (anyio.BrokenResourceError(), LossReason.TRANSPORT),
    (anyio.ClosedResourceError(), LossReason.TRANSPORT),
    (ConnectionRefusedError(111, "Connection refused"), LossReason.TRANSPORT),
    (OSError(32, "Broken pipe"), LossReason.TRANSPORT),
    (EOFError(), LossReason.EOF),
    (anyio.EndOfStream(), LossReason.EOF),
    (MCPError(mcp_types.CONNECTION_CLOSED, "Connection closed"), LossReason.EOF),
    (MCPError(mcp_types.METHOD_NOT_FOUND, "Method not found"), LossReason.PROTOCOL),
    (MCPError(mcp_types.INTERNAL_ERROR, "boom"), LossReason.PROTOCOL),
    (_validation_error(), LossReason.PROTOCOL),
    (UpstreamProtocolError("upstream 'x' repeated tools/list cursor 'c'"), LossReason.PROTOCOL),
    (TimeoutError(), LossReason.TIMEOUT),
    (RuntimeError("something unexpected"), LossReason.PROTOCOL),
]


@pytest.mark.parametrize(("exc", "reason"), CASES, ids=[f"{type(e).__name__}-{r.value}" for e, r in CASES])
def test_classify_by_type(exc: BaseException, reason: LossReason) -> None:
    assert classify(exc) is reason


def test_the_message_text_decides_nothing() -> None:
    # "Connection closed" / "Session terminated" words in another error's text do not make
    # it a session loss; only the type (and JSON-RPC code) does.
    assert classify(MCPError(mcp_types.INVALID_REQUEST, "Session terminated")) is LossReason.PROTOCOL
    assert classify(RuntimeError("Connection closed")) is LossReason.PROTOCOL
    assert classify(MCPError(mcp_types.CONNECTION_CLOSED, "anything")) is LossReason.EOF


def test_a_32000_on_a_live_connection_is_the_upstreams_answer() -> None:
    # -32000 is also the first code of JSON-RPC's server-error range: an upstream's own error.
    assert classify(MCPError(mcp_types.CONNECTION_CLOSED, "quota exceeded"), live=True) is LossReason.PROTOCOL
    assert classify(anyio.EndOfStream(), live=True) is LossReason.EOF


def test_timeout_is_not_taken_for_a_transport_error() -> None:
    assert issubclass(TimeoutError, OSError)  # why the order of checks matters
    assert classify(TimeoutError("timed out")) is LossReason.TIMEOUT


def test_groups_are_classified_by_their_innermost_error() -> None:
    group = ExceptionGroup("tg", [ExceptionGroup("inner", [anyio.BrokenResourceError()])])
    assert classify(group) is LossReason.TRANSPORT
    assert describe(ExceptionGroup("tg", [MCPError(-32603, "boom")])) == "JSON-RPC error -32603: boom"


def test_which_reasons_end_the_session() -> None:
    gone = {r for r in LossReason if r.session_gone}
    assert gone == {LossReason.EOF, LossReason.TRANSPORT, LossReason.SESSION_EXPIRED}


def test_call_error_maps_onto_the_error_tree() -> None:
    op = "tools/call echo"
    lost = call_error("web", op, anyio.BrokenResourceError(), LossReason.TRANSPORT)
    assert isinstance(lost, UpstreamUnavailable)
    assert str(lost) == "upstream 'web' lost its session during tools/call echo: BrokenResourceError"
    expired = MCPError(mcp_types.INVALID_REQUEST, "Session terminated")
    assert isinstance(call_error("web", op, expired, LossReason.SESSION_EXPIRED), UpstreamUnavailable)
    rpc = call_error("web", op, MCPError(-32602, "bad args"), LossReason.PROTOCOL)
    assert isinstance(rpc, UpstreamProtocolError)
    assert str(rpc) == "upstream 'web' answered tools/call echo with JSON-RPC error -32602: bad args"
    stand_in = MCPError(-32603, "the result from upstream 'web' is larger than max_result_bytes (1024 bytes) and was "
                                "refused", data=dict(STAND_IN))
    refused = call_error("web", op, stand_in, LossReason.PROTOCOL)
    assert isinstance(refused, UpstreamProtocolError) and str(refused) == (
        "tools/call echo on upstream 'web' failed: the result from upstream 'web' is larger than max_result_bytes "
        "(1024 bytes) and was refused")  # not "upstream 'web' answered tools/call echo with JSON-RPC error -32603"
    invalid = call_error("web", op, _validation_error(), LossReason.PROTOCOL)
    assert isinstance(invalid, UpstreamProtocolError) and "sent an invalid result for tools/call echo" in str(invalid)
    other = call_error("web", op, RuntimeError("odd"), LossReason.PROTOCOL)
    assert str(other) == "upstream 'web' failed tools/call echo: RuntimeError: odd"


async def test_http_404_on_a_session_id_flags_the_session_expired() -> None:
    seen: list[bool] = []
    hook = _response_hook(lambda: seen.append(True), None)
    with_session = httpx2.Request("POST", URL, headers={"mcp-session-id": "abc"})
    await hook(httpx2.Response(200, request=with_session))
    assert seen == []
    # No session id: a 404 is the 2026-07-28 spelling of method-not-found, not an expiry.
    await hook(httpx2.Response(404, request=_request()))
    assert seen == []
    await hook(httpx2.Response(404, request=with_session))
    assert seen == [True]


@pytest.mark.hostile
async def test_a_401_is_said_to_be_an_authentication_failure_naming_the_header_not_its_value() -> None:
    up = HttpUpstream(name="web", url="http://op:pw-secret@127.0.0.1:9/mcp?key=k",
                      headers={"Authorization": "Bearer tok-secret-123", "X-Team": "blue"})
    auth = AuthWatch(up)
    hook = _response_hook(None, auth.response)
    sdk_stand_in = MCPError(mcp_types.INTERNAL_ERROR, "Server returned an error response")
    await hook(httpx2.Response(401, request=httpx2.Request("POST", up.url)))
    said = auth.describe(sdk_stand_in)
    assert said == ("authentication failed (HTTP 401) at http://127.0.0.1:9/mcp; check the 'Authorization' "
                    "and 'X-Team' headers set in [[upstream]] 'web' headers, and the password in its url")
    assert "secret" not in said and "blue" not in said
    await hook(httpx2.Response(200, request=httpx2.Request("POST", up.url)))  # accepted again
    assert auth.describe(sdk_stand_in) == "JSON-RPC error -32603: Server returned an error response"
    # SSE: the connect raises the status itself; with no headers configured, that is said.
    bare = AuthWatch(HttpUpstream(name="bare", url=URL))
    refused = httpx2.HTTPStatusError("401", request=_request(), response=httpx2.Response(401, request=_request()))
    assert bare.failure(refused) == (
        "authentication failed (HTTP 401) at http://127.0.0.1:9/mcp; no headers are configured in [[upstream]] "
        """'bare'; set the one the server expects, e.g. headers = { Authorization = "Bearer ${TOKEN}" }""")
    assert bare.failure(httpx2.ConnectError("refused", request=_request())) is None


def test_record_from_tool_keeps_title_output_schema_and_annotations() -> None:
    output: dict[str, Any] = {"type": "object", "properties": {"sum": {"type": "number"}}}
    tool = mcp_types.Tool(
        name="add",
        title="Add numbers",
        description="Adds two numbers.",
        input_schema={"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        output_schema=output,
        annotations=mcp_types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    )
    rec = record_from_tool("calc", tool)
    assert (rec.server, rec.tool, rec.description) == ("calc", "add", "Adds two numbers.")
    assert rec.title == "Add numbers"
    assert rec.output_schema == output
    assert rec.annotations == {"readOnlyHint": True, "idempotentHint": True}
    assert rec.input_schema["properties"]["a"] == {"type": "number"}


def test_record_from_tool_without_extras() -> None:
    rec = record_from_tool("calc", mcp_types.Tool(name="noop", input_schema={"type": "object"}))
    assert rec.title is None and rec.output_schema is None and rec.annotations is None
    assert rec.description == ""


async def test_a_call_as_a_ready_session_ends_says_it_lost_its_session_not_that_it_is_ready() -> None:
    # A call in the moment between a session's end (its client gone) and its leaving READY
    # was told "upstream 'web' is ready".
    from toolatlas.errors import UpstreamUnavailable
    from toolatlas.upstream.session import UpstreamSession
    from toolatlas.upstream.state import UpstreamState

    async def on_tools(_name: str, _tools: object) -> None:
        return None

    session = UpstreamSession(HttpUpstream(name="web", url=URL), on_tools)
    session.state = UpstreamState.READY  # as the owner task leaves it until the teardown's leave()
    with pytest.raises(UpstreamUnavailable) as caught:
        await session.request("tools/call echo", lambda _client: anyio.sleep(0))
    assert str(caught.value) == "upstream 'web' lost its session: it ended; retry in a moment"


def test_an_http_transport_failure_names_its_endpoint_and_a_bare_timeout_what_it_waited_for() -> None:
    """A remote upstream's reason read "ConnectError: All connection attempts failed" (which of
    a dozen upstreams' hosts?) or a bare "ReadTimeout" / "PoolTimeout" (httpx gives timeouts no
    message). The endpoint is named, without userinfo or query (they may hold secrets)."""
    req = httpx2.Request("POST", "http://user:pw@127.0.0.1:9/mcp?token=s3cret")
    assert describe(httpx2.ConnectError("All connection attempts failed", request=req)) == (
        "ConnectError: All connection attempts failed (at http://127.0.0.1:9/mcp)")
    assert describe(httpx2.ReadTimeout("", request=req)) == "ReadTimeout: no data came in time (at http://127.0.0.1:9/mcp)"
    assert describe(httpx2.PoolTimeout("", request=req)).startswith("PoolTimeout: no free connection to the upstream")
    assert describe(httpx2.ConnectError("refused")) == "ConnectError: refused"  # no request: nothing to name
