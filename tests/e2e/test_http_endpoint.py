"""The streamable-HTTP endpoint of a real `toolatlas serve`: Python SDK clients in both protocol
modes (2025-11-25 sessions and the 2026-07-28 default), bearer tokens mapped to [[access]]
rules, Host/Origin checks, the 2026-07-28 header validation, and the socket alongside."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.hostile_rpc import (
    BATCH, CASES, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, Case, check_answer, check_batch_answer, tool_call,
)
from tests.support.ports import free_port
from tests.support.results import text as _text
from toolatlas.config import parse
from toolatlas.errors import ConfigError
from toolatlas.surface.http import TokenTable, hash_token
from toolatlas.surface.unix import unix_client

ALL_TOKEN = "s3cret-all-upstreams"
ALPHA_TOKEN = "s3cret-only-alpha"
NEW_ERA = "2026-07-28"


def http_section(port: int, *, anonymous: str = "") -> str:
    return (
        f'[http]\nlisten = "127.0.0.1:{port}"\n'
        + (f'anonymous = "{anonymous}"\n' if anonymous else "")
        + f'[[http.tokens]]\nname = "ops"\nsha256 = "{hash_token(ALL_TOKEN)}"\n'
        + f'[[http.tokens]]\nname = "alpha-only"\nsha256 = "{hash_token(ALPHA_TOKEN)}"\n'
        + '[[access]]\ntokens = ["ops"]\nservers = ["*"]\n'
        + '[[access]]\ntokens = ["alpha-only"]\nservers = ["alpha"]\n'
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("httpgw")
    port = free_port()
    upstreams = http_section(port) + stdio_testserver("alpha") + stdio_testserver("beta")
    d = Daemon(tmp, upstreams)
    d.http_url = f"http://127.0.0.1:{port}/mcp"  # type: ignore[attr-defined]
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")
        yield d


@asynccontextmanager
async def _transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def _client(url: str, token: str | None, mode: str = "auto", **headers: str) -> Client:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return Client(_transport(url, headers), mode=mode)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_sdk_client_lists_searches_and_executes(gw: Daemon, mode: str) -> None:
    with anyio.fail_after(60):
        async with _client(gw.http_url, ALL_TOKEN, mode) as c:  # type: ignore[attr-defined]
            if mode == "legacy":
                assert c.protocol_version == "2025-11-25"
            else:
                assert c.protocol_version == NEW_ERA
            names = [t.name for t in (await c.list_tools()).tools]
            assert names == ["tool_search", "execute_tool", "catalog_status"]
            assert names == [t.name for t in (await c.list_tools()).tools]  # deterministic
            found = await c.call_tool("tool_search", {"query": "echo a message back", "top_k": 5})
            matches = found.structured_content["matches"]
            assert any(m["name"] == "alpha__echo" for m in matches), matches
            assert {m["server"] for m in matches} <= {"alpha", "beta"}
            done = await c.call_tool("execute_tool", {"name": "alpha__echo", "arguments": {"message": "over http"}})
            assert not done.is_error, done
            assert _text(done) == "Echo: over http"
            assert "alpha" in (c.instructions or "") and "beta" in (c.instructions or "")


async def _raw(url: str, body: dict[str, Any], headers: dict[str, str]) -> httpx2.Response:
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=30) as h:
        return await h.post(url, content=json.dumps(body), headers={**base, **headers})


def _init_body() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


async def test_no_token_or_wrong_token_is_refused(gw: Daemon) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    with anyio.fail_after(30):
        missing = await _raw(url, _init_body(), {})
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = await _raw(url, _init_body(), {"Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
        basic = await _raw(url, _init_body(), {"Authorization": f"Basic {ALL_TOKEN}"})
        assert basic.status_code == 401
        good = await _raw(url, _init_body(), {"Authorization": f"Bearer {ALL_TOKEN}"})
        assert good.status_code == 200
        assert good.headers.get("mcp-session-id")


async def test_two_tokens_see_what_their_access_rules_allow(gw: Daemon) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    with anyio.fail_after(60):
        for mode in ("legacy", "auto"):
            async with _client(url, ALPHA_TOKEN, mode) as c:
                found = await c.call_tool("tool_search", {"query": "echo a message back", "top_k": 10})
                assert {m["server"] for m in found.structured_content["matches"]} == {"alpha"}
                refused = await c.call_tool("execute_tool", {"name": "beta__echo", "arguments": {"message": "x"}})
                assert refused.is_error
                status = (await c.call_tool("catalog_status", {})).structured_content
                assert [s["name"] for s in status["servers"]] == ["alpha"]
            async with _client(url, ALL_TOKEN, mode) as c:
                status = (await c.call_tool("catalog_status", {})).structured_content
                assert sorted(s["name"] for s in status["servers"]) == ["alpha", "beta"]
                ok = await c.call_tool("execute_tool", {"name": "beta__echo", "arguments": {"message": "y"}})
                assert not ok.is_error and _text(ok) == "Echo: y"


async def test_a_session_cannot_be_used_with_another_token(gw: Daemon) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    with anyio.fail_after(30):
        opened = await _raw(url, _init_body(), {"Authorization": f"Bearer {ALL_TOKEN}"})
        sid = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        hijack = await _raw(url, listing, {"Authorization": f"Bearer {ALPHA_TOKEN}", "Mcp-Session-Id": sid,
                                           "MCP-Protocol-Version": "2025-11-25"})
        assert hijack.status_code == 404


async def test_another_tokens_delete_does_not_end_the_sessions_connection(gw: Daemon) -> None:
    """A DELETE of someone else's session is refused (404) and changes nothing for it: the
    session keeps its connection (the audit lines' `connection`, its log level)."""
    url = gw.http_url  # type: ignore[attr-defined]
    mine = {"Authorization": f"Bearer {ALL_TOKEN}"}

    def connections(client: str) -> list[int]:
        return [e["connection"] for line in gw.log.read_text(errors="replace").splitlines() if line.startswith("{")
                and (e := json.loads(line))["event"] == "tools_list_served" and e.get("client") == client]

    with anyio.fail_after(30):
        body = _init_body()
        body["params"]["clientInfo"]["name"] = "delete-victim"
        sid = (await _raw(url, body, mine)).headers["mcp-session-id"]
        session = {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        assert (await _raw(url, listing, {**mine, **session})).status_code == 200
        async with httpx2.AsyncClient(timeout=30) as h:
            other = await h.delete(url, headers={"Authorization": f"Bearer {ALPHA_TOKEN}", **session})
        assert other.status_code == 404
        assert (await _raw(url, listing, {**mine, **session})).status_code == 200
    seen = connections("delete-victim")
    assert len(seen) == 2 and seen[0] == seen[1], seen


async def test_socket_and_http_connections_never_share_an_id(gw: Daemon) -> None:
    """Connection ids come from one sequence, in order of arrival, whatever the surface: a
    feedback window, an audit line's `connection` or a session's state keyed by it can never
    mix a socket client with an HTTP one (the socket counted from 1 and HTTP from 1,000,000,
    so a long-running daemon's millionth socket connection took an HTTP session's id)."""
    url = gw.http_url  # type: ignore[attr-defined]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}

    async def on_socket(name: str) -> None:
        async with Client(unix_client(gw.socket), client_info=types.Implementation(name=name, version="1")) as c:
            await c.list_tools()

    with anyio.fail_after(60):
        await on_socket("order-1")
        body = _init_body()
        body["params"]["clientInfo"]["name"] = "order-2"
        auth = {"Authorization": f"Bearer {ALL_TOKEN}"}
        sid = (await _raw(url, body, auth)).headers["mcp-session-id"]
        session = {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
        assert (await _raw(url, listing, {**auth, **session})).status_code == 200
        await on_socket("order-3")
    seen = [(e["client"], e["connection"]) for line in gw.log.read_text(errors="replace").splitlines()
            if line.startswith("{") and (e := json.loads(line))["event"] == "tools_list_served"
            and e.get("client", "").startswith("order-")]
    assert [c for c, _ in seen] == ["order-1", "order-2", "order-3"], seen
    ids = [i for _, i in seen]
    assert ids == sorted(set(ids)), f"connection ids not one sequence in order of arrival: {seen}"


async def test_foreign_host_and_origin_are_refused(gw: Daemon) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}"}
    with anyio.fail_after(30):
        rebound = await _raw(url, _init_body(), {**auth, "Host": "evil.example.com"})
        assert rebound.status_code == 421
        foreign = await _raw(url, _init_body(), {**auth, "Origin": "http://evil.example.com"})
        assert foreign.status_code == 403
        port = url.split(":")[2].split("/")[0]
        same = await _raw(url, _init_body(), {**auth, "Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"})
        assert same.status_code == 200
        elsewhere = await _raw(url.replace("/mcp", "/other"), _init_body(), auth)
        assert elsewhere.status_code == 404


async def test_a_browser_page_at_an_allowed_origin_can_use_the_endpoint(gw: Daemon) -> None:
    """CORS: a page at an allowed origin other than the URL's (here http://localhost:PORT for
    http://127.0.0.1:PORT) gets its preflight answered without a token, and answers it can
    read (its origin named, Mcp-Session-Id and WWW-Authenticate exposed), a 401 included; a
    foreign origin's preflight is refused (403) and names no origin."""
    url = gw.http_url  # type: ignore[attr-defined]
    port = url.split(":")[2].split("/")[0]
    page = f"http://localhost:{port}"
    asks = {"Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, mcp-protocol-version"}
    with anyio.fail_after(30):
        async with httpx2.AsyncClient(timeout=30) as h:
            pre = await h.options(url, headers={"Origin": page, **asks})
            assert pre.status_code == 204, pre.text
            assert pre.headers["access-control-allow-origin"] == page
            assert "POST" in pre.headers["access-control-allow-methods"]
            assert "authorization" in pre.headers["access-control-allow-headers"]
            foreign = await h.options(url, headers={"Origin": "http://evil.example.com", **asks})
            assert foreign.status_code == 403 and "access-control-allow-origin" not in foreign.headers
        opened = await _raw(url, _init_body(), {"Authorization": f"Bearer {ALL_TOKEN}", "Origin": page})
        assert opened.status_code == 200 and opened.headers["access-control-allow-origin"] == page
        assert "mcp-session-id" in opened.headers["access-control-expose-headers"]
        refused = await _raw(url, _init_body(), {"Origin": page})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page
        assert "www-authenticate" in refused.headers["access-control-expose-headers"]


def _new_era_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": name, "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": NEW_ERA,
                  "io.modelcontextprotocol/clientCapabilities": {}}}}


async def test_new_era_headers_must_match_the_body(gw: Daemon) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}", "MCP-Protocol-Version": NEW_ERA}
    body = _new_era_call("catalog_status", {})
    with anyio.fail_after(30):
        ok = await _raw(url, body, {**auth, "Mcp-Method": "tools/call", "Mcp-Name": "catalog_status"})
        assert ok.status_code == 200, ok.text
        wrong_method = await _raw(url, body, {**auth, "Mcp-Method": "tools/list", "Mcp-Name": "catalog_status"})
        assert wrong_method.status_code == 400
        wrong_name = await _raw(url, body, {**auth, "Mcp-Method": "tools/call", "Mcp-Name": "tool_search"})
        assert wrong_name.status_code == 400
        assert wrong_method.json()["error"]["code"] == -32020  # header mismatch
        assert wrong_name.json()["error"]["code"] == -32020
        mismatched_version = await _raw(url, body, {**auth, "MCP-Protocol-Version": "2099-01-01",
                                                     "Mcp-Method": "tools/call", "Mcp-Name": "catalog_status"})
        assert mismatched_version.status_code == 400
        assert mismatched_version.json()["error"]["code"] == -32020
        future = _new_era_call("catalog_status", {})
        future["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
        unsupported = await _raw(url, future, {**auth, "MCP-Protocol-Version": "2099-01-01",
                                               "Mcp-Method": "tools/call", "Mcp-Name": "catalog_status"})
        assert unsupported.status_code == 400
        error = unsupported.json()["error"]
        assert error["code"] == -32022 and NEW_ERA in error["data"]["supported"]


async def test_a_missing_new_era_routing_header_is_said_missing(gw: Daemon) -> None:
    """A 2026-07-28 request sent without Mcp-Method, or a tools/call without Mcp-Name, is told
    which header is missing and its value. Before, the SDK said the header 'does not match'
    the body, which reads as a wrong value where none was sent."""
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}", "MCP-Protocol-Version": NEW_ERA}
    body = _new_era_call("catalog_status", {})
    with anyio.fail_after(30):
        no_method = await _raw(url, body, auth)
        no_name = await _raw(url, body, {**auth, "Mcp-Method": "tools/call"})
    assert no_method.status_code == no_name.status_code == 400
    assert no_method.json()["error"] == {"code": -32020, "message": "the Mcp-Method header is missing: a 2026-07-28 "
                                         "tools/call request names its method in it too (Mcp-Method: tools/call)"}
    assert no_name.json()["error"] == {"code": -32020, "message": "the Mcp-Name header is missing: a 2026-07-28 "
                                       "tools/call request names its `name` in it too (Mcp-Name: catalog_status)"}
    assert no_name.json()["id"] == 7


async def test_wrong_content_type_and_oversized_bodies_get_json_rpc_errors(gw: Daemon) -> None:
    """What the SDK answered in plain text ("Invalid Content-Type header", "Request body too
    large") is a JSON-RPC error saying what to send, as every other refusal is; a body over
    [daemon] max_message_bytes gets 413 whether its length is declared or it comes chunked."""
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}", "Accept": "application/json, text/event-stream"}
    huge = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "a" * 4_200_000}}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(huge), 65536):
            yield huge[at:at + 65536]

    with anyio.fail_after(60):
        async with httpx2.AsyncClient(timeout=30) as h:
            for version in ("2025-11-25", NEW_ERA):
                plain = await h.post(url, content=json.dumps(_init_body()), headers={
                    **auth, "Content-Type": "text/plain", "MCP-Protocol-Version": version, "Mcp-Method": "initialize"})
                assert plain.status_code == 400, plain.text
                assert "Content-Type must be application/json" in plain.json()["error"]["message"]
            json_type = {**auth, "Content-Type": "application/json"}
            declared = await h.post(url, content=huge, headers=json_type)
            streamed = await h.post(url, content=chunks(), headers=json_type)
            for response in (declared, streamed):
                assert response.status_code == 413, response.text[:200]
                error = response.json()["error"]
                assert error["code"] == -32600 and "max_message_bytes" in error["message"], error
            assert (await _raw(url, _init_body(), {"Authorization": f"Bearer {ALL_TOKEN}"})).status_code == 200


async def test_params_the_sdk_refuses_are_said_by_field_in_both_eras(gw: Daemon) -> None:
    """A 2025-11-25 initialize without `clientInfo` and a 2026-07-28 resources/read without
    `uri` get an error naming the field. Before, both were the SDK's bare 'Invalid request
    parameters' with empty data."""
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}"}
    no_info = _init_body()
    del no_info["params"]["clientInfo"]
    read = {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"_meta": _new_era_call("x", {})["params"]["_meta"]}}
    with anyio.fail_after(30):
        legacy = await _raw(url, no_info, auth)
        modern = await _raw(url, read, {**auth, "MCP-Protocol-Version": NEW_ERA, "Mcp-Method": "resources/read"})
    assert "invalid params: initialize needs `params.clientInfo`" in legacy.text, legacy.text
    assert modern.json()["error"] == {"code": -32602, "message": "invalid params: resources/read needs `params.uri`"}


async def test_new_era_refusals_of_method_and_accept_say_what_to_send(gw: Daemon) -> None:
    """A 2026-07-28 GET or DELETE (405) and a POST whose Accept lacks text/event-stream (406)
    get a JSON-RPC error saying what to send, as the 2025-11-25 ones do. Before, the SDK sent
    both with an empty body: a client saw a bare status and nothing to act on."""
    url = gw.http_url  # type: ignore[attr-defined]
    modern = {"Authorization": f"Bearer {ALL_TOKEN}", "MCP-Protocol-Version": NEW_ERA}
    body = _new_era_call("catalog_status", {})
    with anyio.fail_after(30):
        async with httpx2.AsyncClient(timeout=30) as h:
            get = await h.get(url, headers=modern)
            delete = await h.delete(url, headers=modern)
            json_only = await h.post(url, content=json.dumps(body), headers={
                **modern, "Content-Type": "application/json", "Accept": "application/json",
                "Mcp-Method": "tools/call", "Mcp-Name": "catalog_status"})
    for response, verb in ((get, "GET"), (delete, "DELETE")):
        assert response.status_code == 405 and response.headers["allow"] == "POST", response
        error = response.json()["error"]
        assert error["message"].startswith(f"Method Not Allowed: {verb} with MCP-Protocol-Version '{NEW_ERA}'"), error
    assert json_only.status_code == 406, json_only
    message = json_only.json()["error"]["message"]
    assert "application/json and text/event-stream" in message and "'application/json'" in message, message


async def test_a_mistyped_protocol_version_header_is_said_so(gw: Daemon) -> None:
    """A request whose MCP-Protocol-Version names no version ('2025-11-52') is told that, with
    the versions to send. Before, the SDK took it for a 2026-07-28 request and answered that
    `params._meta` lacked its envelope keys, which a 2025-era client never needs."""
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}"}
    with anyio.fail_after(30):
        opened = await _raw(url, _init_body(), auth)
        session = {**auth, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
        typo = await _raw(url, {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                          {**session, "MCP-Protocol-Version": "2025-11-52"})
        right = await _raw(url, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                           {**session, "MCP-Protocol-Version": "2025-11-25"})
    assert typo.status_code == 400, typo.text
    error = typo.json()
    assert error["id"] == 5 and error["error"]["code"] == -32600, error
    message = error["error"]["message"]
    assert message.startswith("MCP-Protocol-Version '2025-11-52' is not a version this server speaks"), message
    assert "2025-11-25" in message and "_meta" in message, message
    assert right.status_code == 202, right.text


async def test_a_refused_request_names_no_session(gw: Daemon) -> None:
    """A request without a session id that is refused (not an initialize, or one that does not
    accept an event stream) opens no session, so its answer carries no Mcp-Session-Id: the SDK
    put the id of the session it discarded there, and the TypeScript client keeps an id from
    any answer, sending it with its next initialize too (404 each time)."""
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    with anyio.fail_after(30):
        no_session = await _raw(url, listing, auth)
        json_only = await _raw(url, _init_body(), {**auth, "Accept": "application/json"})
        async with httpx2.AsyncClient(timeout=30) as h:
            stream = await h.get(url, headers={**auth, "Accept": "text/event-stream"})
        for refused, status in ((no_session, 400), (json_only, 406), (stream, 400)):
            assert refused.status_code == status, refused.text
            assert "mcp-session-id" not in refused.headers, refused.headers
            assert refused.json()["error"]["message"]
        opened = await _raw(url, _init_body(), auth)
        assert opened.status_code == 200 and opened.headers["mcp-session-id"]


async def test_server_discover_and_initialize_both_answer(gw: Daemon) -> None:
    url = gw.http_url  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {ALL_TOKEN}"}
    discover = {"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": NEW_ERA,
                  "io.modelcontextprotocol/clientCapabilities": {}}}}
    with anyio.fail_after(30):
        d = await _raw(url, discover, {**auth, "MCP-Protocol-Version": NEW_ERA, "Mcp-Method": "server/discover"})
        assert d.status_code == 200, d.text
        result = d.json()["result"]
        assert NEW_ERA in result["supportedVersions"]
        assert "alpha" in result["instructions"] and "beta" in result["instructions"]
        i = await _raw(url, _init_body(), auth)
        assert i.status_code == 200
        assert "2025-11-25" in i.text
        # the gateway sends 2025-era HTTP sessions every list change: it says so (it said listChanged false)
        caps = json.loads(next(ln[5:] for ln in i.text.splitlines() if ln.startswith("data:")))["result"]["capabilities"]
        assert caps["tools"]["listChanged"] and caps["prompts"]["listChanged"] and caps["resources"]["listChanged"], caps


async def test_socket_keeps_working_alongside(gw: Daemon) -> None:
    with anyio.fail_after(30):
        async with Client(unix_client(gw.socket)) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            assert names == ["tool_search", "execute_tool", "catalog_status"]
            status = (await c.call_tool("catalog_status", {})).structured_content
            assert sorted(s["name"] for s in status["servers"]) == ["alpha", "beta"]


def test_token_table_matches_by_hash_only() -> None:
    from toolatlas.config import HttpToken

    table = TokenTable([HttpToken(name="a", sha256=hash_token("one")), HttpToken(name="b", sha256=hash_token("two"))])
    assert table.name_for("one") == "a"
    assert table.name_for("two") == "b"
    assert table.name_for("three") is None
    assert table.name_for(hashlib.sha256(b"one").hexdigest()) is None  # the hash itself is no token


def test_config_checks_the_http_section() -> None:
    ok = parse('[http]\nlisten = "127.0.0.1:8765"\n[[http.tokens]]\nname = "x"\nsha256 = "' + "a" * 64 + '"\n')
    assert ok.http.listen == "127.0.0.1:8765"
    assert parse("").http.listen == ""  # off by default
    with pytest.raises(ConfigError, match="no \\[\\[http.tokens\\]\\]"):
        parse('[http]\nlisten = "127.0.0.1:8765"\n')
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse('[http]\nlisten = "8765"\nanonymous = "dev"\n')
    with pytest.raises(ConfigError, match="sha256"):
        parse('[http]\nlisten = "127.0.0.1:1"\n[[http.tokens]]\nname = "x"\nsha256 = "plaintext"\n')
    # requests without a token would otherwise be the token named so: its access, and its sessions
    with pytest.raises(ConfigError, match="anonymous 'x' is also a \\[\\[http.tokens\\]\\] name"):
        parse('[http]\nlisten = "127.0.0.1:1"\nanonymous = "x"\n[[http.tokens]]\nname = "x"\nsha256 = "' + "a" * 64 + '"\n')


async def test_bind_error_at_start_port_zero_and_stop_accepting() -> None:
    import socket

    from mcp.server.lowlevel.server import Server

    from toolatlas.config import HttpSection
    from toolatlas.surface.http import HttpEndpoint

    with anyio.fail_after(30), socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ep = HttpEndpoint(Server("t"), HttpSection(listen=f"127.0.0.1:{taken}", anonymous="dev"))
        with pytest.raises(ConfigError, match="cannot bind"):
            await ep.run()  # raises before it would have called started()
        free = HttpEndpoint(Server("t", instructions="hello"), HttpSection(listen="127.0.0.1:0", anonymous="dev"))
        async with anyio.create_task_group() as tg:
            await tg.start(free.run)
            assert free.port != 0 and free.url == f"http://127.0.0.1:{free.port}/mcp"
            async with Client(_transport(free.url, {}), mode="legacy") as c:
                assert c.instructions == "hello"
            await free.stop_accepting()
            with pytest.raises(OSError):
                await anyio.connect_tcp("127.0.0.1", free.port)
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_clients_are_counted_with_socket_clients(gw: Daemon, mode: str) -> None:
    with anyio.fail_after(60):
        async with _client(gw.http_url, ALL_TOKEN, mode) as c:  # type: ignore[attr-defined]
            # the HTTP request asking is a live client, as a socket connection asking is
            over_http = json.loads(_text(await c.call_tool("catalog_status", {})))["clients"]
    assert over_http >= 1


@pytest.fixture(scope="module")
def session(gw: Daemon) -> dict[str, str]:
    """The headers of one legacy (2025-11-25) session, initialized."""
    url = gw.http_url  # type: ignore[attr-defined]
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {ALL_TOKEN}"}
    with httpx2.Client(timeout=30) as h:
        opened = h.post(url, content=json.dumps(_init_body()), headers=base)
        assert opened.status_code == 200, opened.text
        headers = {**base, "Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        done = h.post(url, content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}', headers=headers)
        assert done.status_code == 202, done.text
    return headers


def _answer(response: httpx2.Response) -> dict[str, Any]:
    """The one JSON-RPC message of a POST's answer: a JSON body or an SSE `data:` event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        assert len(data) == 1, response.text
        return json.loads(data[0])
    return response.json()


@pytest.mark.hostile
@pytest.mark.timeout(60)
def test_a_batch_over_http_gets_an_error_for_each_of_its_requests(gw: Daemon, session: dict[str, str]) -> None:
    with httpx2.Client(timeout=30) as h:
        response = h.post(gw.http_url, content=BATCH, headers=session)  # type: ignore[attr-defined]
        assert response.status_code == 400, response.text
        check_batch_answer(response.json())


_HTTP_CASES = [*CASES, Case("query of 1 MB", tool_call(22, "tool_search", {"query": "echo " * 200_000}), None, 22,
                            '"matches"')]


@pytest.mark.hostile
@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", _HTTP_CASES, ids=str)
def test_malformed_jsonrpc_over_http_gets_a_json_rpc_error(gw: Daemon, session: dict[str, str], case: Case) -> None:
    """Issue #15 item 12 on the HTTP endpoint: each case of tests/support/hostile_rpc.py as a
    POST body gets its answer (a refused message: 400 with the JSON-RPC error), and the same
    session answers a ping afterwards."""
    url = gw.http_url  # type: ignore[attr-defined]
    with httpx2.Client(timeout=30) as h:
        response = h.post(url, content=case.body, headers=session)
        refused = case.code in (PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS)
        assert response.status_code == (400 if refused else 200), (case.name, response.status_code, response.text[:300])
        check_answer(case, _answer(response))
        ping = h.post(url, content=b'{"jsonrpc":"2.0","id":"after","method":"ping"}', headers=session)
        assert _answer(ping) == {"jsonrpc": "2.0", "id": "after", "result": {}}


@pytest.mark.parametrize("version", ["2025-11-25", None])
async def test_a_2025_request_without_a_session_says_to_initialize_first(gw: Daemon, version: str | None) -> None:
    """A 2025-11-25 request other than initialize with no Mcp-Session-Id got the SDK's bare
    "Bad Request: Missing session ID": nothing said where an id comes from."""
    url = gw.http_url  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {ALL_TOKEN}"} | ({"MCP-Protocol-Version": version} if version else {})
    listing = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
    with anyio.fail_after(30):
        response = await _raw(url, listing, headers)
    assert response.status_code == 400, response
    message = response.json()["error"]["message"]
    assert message.startswith("Bad Request: Missing session ID: "), message
    assert "send initialize first" in message and "Mcp-Session-Id" in message, message
