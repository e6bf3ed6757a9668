"""The HTTP endpoint as an OAuth 2.1 resource server (issue 20 item 2), against a local
issuer serving a JWKS on 127.0.0.1 with real RS256 and ES256 keys: Protected Resource
Metadata, WWW-Authenticate with resource_metadata, valid tokens through the SDK client,
every rejected kind of token, key rotation, group claims mapped to [[access]] rules, and
static tokens beside OAuth."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest

from tests.e2e.test_http_endpoint import _client
from tests.support.daemon import Daemon, stdio_testserver
from tests.support.oauth_issuer import LocalIssuer
from tests.support.ports import free_port
from toolatlas.surface.http import hash_token

STATIC = "static-ops-token-still-works"
ACCEPT = "application/json, text/event-stream"


class Env:
    def __init__(self, d: Daemon, issuer: LocalIssuer, port: int) -> None:
        self.d, self.issuer, self.port = d, issuer, port
        self.origin = f"http://127.0.0.1:{port}"
        self.url = f"{self.origin}/mcp"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("oauth")
    port = free_port()
    with LocalIssuer() as issuer:
        issuer.add_key("rsa-1", "RS256")
        issuer.add_key("ec-1", "ES256")
        cfg = (f'[http]\nlisten = "127.0.0.1:{port}"\n'
               f'[[http.tokens]]\nname = "ops"\nsha256 = "{hash_token(STATIC)}"\n'
               '[http.oauth]\njwks_ttl = 2\njwks_min_refresh = 0\nscopes_supported = ["tools"]\n'
               f'issuers = [{{issuer = "{issuer.issuer}", jwks_url = "{issuer.jwks_url}"}}]\n'
               '[[endpoint]]\nname = "ops"\nhttp_path = "/ops/mcp"\nupstreams = ["alpha"]\n'
               '[[access]]\ntokens = ["ops"]\nservers = ["*"]\n'
               '[[access]]\noauth_groups = ["ops"]\nservers = ["*"]\n'
               '[[access]]\noauth_groups = ["interns"]\nservers = ["alpha"]\n'
               f'[[access]]\noauth_issuers = ["{issuer.issuer}"]\noauth_subjects = ["bound"]\nservers = ["beta"]\n'
               + stdio_testserver("alpha") + stdio_testserver("beta"))
        d = Daemon(tmp, cfg, daemon_extra='access_default = "deny"\n')
        with d:
            d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "ready")
            yield Env(d, issuer, port)


def _post(env: Env, token: str | None) -> httpx2.Response:
    headers = {"Accept": ACCEPT}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    return httpx2.post(env.url, json=body, headers=headers, timeout=30)


def _session(env: Env, token: str) -> dict[str, Any]:
    """What a client with `token` sees through the real SDK client: server names in
    catalog_status and the servers of tool_search's matches."""
    out: dict[str, Any] = {}

    async def run() -> None:
        with anyio.fail_after(60):
            async with _client(env.url, token) as c:
                names = [t.name for t in (await c.list_tools()).tools]
                assert names == ["tool_search", "execute_tool", "catalog_status"]
                status = await c.call_tool("catalog_status", {})
                out["servers"] = sorted(s["name"] for s in status.structured_content["servers"])
                found = await c.call_tool("tool_search", {"query": "echo a message back", "top_k": 10})
                out["matched"] = sorted({m["server"] for m in found.structured_content["matches"]})
                beta = await c.call_tool("beta__echo", {"message": "hi"})
                out["beta_error"] = beta.is_error

    anyio.run(run)
    return out


def test_protected_resource_metadata_and_challenge(env: Env) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        doc = httpx2.get(env.origin + path, timeout=30).json()
        assert doc["resource"] == env.url and doc["authorization_servers"] == [env.issuer.issuer], doc
        assert doc["bearer_methods_supported"] == ["header"] and doc["scopes_supported"] == ["tools"]
        assert "none" not in doc["resource_signing_alg_values_supported"]
    r = _post(env, None)
    assert r.status_code == 401
    challenge = r.headers["www-authenticate"]
    assert f'resource_metadata="{env.origin}/.well-known/oauth-protected-resource/mcp"' in challenge
    assert "error=" not in challenge  # no credential presented: no error code (RFC 6750 3.1)


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1"])
def test_valid_tokens_of_both_key_types(env: Env, kid: str) -> None:
    token = env.issuer.token(kid, env.issuer.claims(env.url, groups=["ops"], sub=f"alice-{kid}"))
    seen = _session(env, token)
    assert seen == {"servers": ["alpha", "beta"], "matched": ["alpha", "beta"], "beta_error": False}
    principal = f"oauth:{env.issuer.issuer}#alice-{kid}"
    events = [json.loads(x) for x in env.d.log.read_text().splitlines() if principal in x and x.startswith("{")]
    assert {e["event"] for e in events} >= {"tools_list_served", "tool_search_completed", "execute_tool_completed"}
    assert all(e["user"] == f"alice-{kid}" for e in events)


def test_a_group_allowed_one_server_sees_only_it(env: Env) -> None:
    token = env.issuer.token("ec-1", env.issuer.claims(env.url, roles=["interns"], sub="intern"))
    assert _session(env, token) == {"servers": ["alpha"], "matched": ["alpha"], "beta_error": True}


def test_a_rule_bound_to_the_issuer_matches_its_tokens(env: Env) -> None:
    """`oauth_issuers` binds a rule to the issuers whose claims it means (with several, each
    names its own subjects and groups): this issuer's `bound` gets the rule's beta."""
    token = env.issuer.token("ec-1", env.issuer.claims(env.url, sub="bound"))
    assert _session(env, token) == {"servers": ["beta"], "matched": ["beta"], "beta_error": False}


def _sse_result(response: httpx2.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(data[0])["result"] if data else response.json()["result"]


def test_a_session_follows_the_claims_of_each_requests_token(env: Env) -> None:
    """A 2025-11-25 session opened with a token of group `ops` and used next with a token of
    the same subject that has only `interns` (the IdP took `ops` away; the client refreshed)
    sees what `interns` may use: each request's token decides, not the one that opened it."""
    iss = env.issuer
    ops = iss.token("rsa-1", iss.claims(env.url, groups=["ops"], sub="demoted"))
    intern = iss.token("rsa-1", iss.claims(env.url, groups=["interns"], sub="demoted"))
    base = {"Accept": ACCEPT, "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    with httpx2.Client(timeout=30) as h:
        opened = h.post(env.url, json=init, headers={**base, "Authorization": f"Bearer {ops}"})
        session = {**base, "Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        h.post(env.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
               headers={**session, "Authorization": f"Bearer {ops}"})
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "catalog_status", "arguments": {}}}

        def servers(token: str) -> list[str]:
            result = _sse_result(h.post(env.url, json=call, headers={**session, "Authorization": f"Bearer {token}"}))
            return sorted(s["name"] for s in result["structuredContent"]["servers"])

        assert servers(ops) == ["alpha", "beta"]
        assert servers(intern) == ["alpha"]
        assert servers(ops) == ["alpha", "beta"]


def _event_stream(env: Env, token: str) -> socket.socket:
    """A 2025-11-25 session opened with `token`, and its GET event stream (200, left open)."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "streamer", "version": "1"}}}
    opened = httpx2.post(env.url, json=init, timeout=30, headers={
        "Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    assert opened.status_code == 200, opened.text
    s = socket.create_connection(("127.0.0.1", env.port), timeout=30)
    s.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{env.port}\r\nAuthorization: Bearer {token}\r\n"
              f"Accept: text/event-stream\r\nMcp-Session-Id: {opened.headers['mcp-session-id']}\r\n"
              "MCP-Protocol-Version: 2025-11-25\r\n\r\n".encode())
    assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
    return s


def _ended(s: socket.socket, within: float) -> bool:
    """Whether the daemon ends the stream (its last, empty chunk, or EOF) within `within` seconds."""
    deadline, data = time.monotonic() + within, b""
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            chunk = s.recv(4096)
        except TimeoutError:
            return False
        data += chunk
        if not chunk or data.endswith(b"0\r\n\r\n"):
            return True
    return False


def test_an_event_stream_ends_when_its_oauth_token_expires(env: Env) -> None:
    """A GET event stream opened with an OAuth token ends when the token does (exp plus the
    leeway), as the next request with that token would be refused then: holding a stream is
    no way around a short-lived token (a subject the IdP disabled gets no new one). A stream
    opened with a static token goes on."""
    iss = env.issuer
    now = int(time.time())
    # accepted within the 30 s leeway, and expiring a few seconds from now
    token = iss.token("rsa-1", {**iss.claims(env.url, groups=["ops"], sub="short-lived"), "exp": now - 26})
    expiring, static = _event_stream(env, token), _event_stream(env, STATIC)
    assert _ended(expiring, 30), "the stream of the expired token is still open"
    assert not _ended(static, 0.5), "the static token's stream ended too"
    expiring.close()
    static.close()


def test_static_tokens_keep_working(env: Env) -> None:
    assert _session(env, STATIC)["servers"] == ["alpha", "beta"]


NOW = int(time.time())


@pytest.mark.parametrize("case", ["expired", "not_yet_valid", "wrong_audience", "wrong_issuer", "unknown_kid",
                                  "alg_none", "hs256_public_key", "no_kid", "garbage"])
def test_rejected_tokens(env: Env, case: str) -> None:
    iss = env.issuer
    now = int(time.time())
    good = iss.claims(env.url, groups=["ops"])
    token, expect = {
        "expired": (lambda: iss.token("rsa-1", {**good, "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600}),
                    "expired"),
        "not_yet_valid": (lambda: iss.token("rsa-1", {**good, "nbf": now + 3600, "exp": now + 7200}), "not valid yet"),
        "wrong_audience": (lambda: iss.token("rsa-1", {**good, "aud": "http://127.0.0.1:1/mcp"}), "audience"),
        "wrong_issuer": (lambda: iss.token("rsa-1", {**good, "iss": "http://127.0.0.1:1"}), "issuer"),
        "unknown_kid": (lambda: _unpublished(iss, good), "key id"),
        "alg_none": (lambda: iss.unsigned(good, "rsa-1"), "algorithm 'none'"),
        "hs256_public_key": (lambda: iss.hs256_with_public_key(good, "rsa-1"), "algorithm 'HS256'"),
        "no_kid": (lambda: _no_kid(iss, good), "kid"),
        "garbage": (lambda: "a.b.c", "well-formed"),
    }[case]
    r = _post(env, token())
    assert r.status_code == 401, r.text
    challenge = r.headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge and expect in challenge, challenge
    assert "resource_metadata=" in challenge


def _unpublished(iss: LocalIssuer, claims: dict[str, Any]) -> str:
    if "rogue" not in iss.keys:
        iss.add_key("rogue", "RS256", publish=False)
    return iss.token("rogue", claims)


def _no_kid(iss: LocalIssuer, claims: dict[str, Any]) -> str:
    import jwt

    return jwt.encode(claims, iss.keys["rsa-1"][1], algorithm="RS256")


def test_rotated_keys_are_honoured(env: Env) -> None:
    iss = env.issuer
    old = iss.token("rsa-1", iss.claims(env.url, groups=["ops"]))
    assert _post(env, old).status_code == 200
    iss.rotate("rsa-2", "RS256", drop=["rsa-1"])
    fetches = iss.fetches
    new = iss.token("rsa-2", iss.claims(env.url, groups=["ops"]))
    assert _post(env, new).status_code == 200  # an unknown kid refetches the JWKS
    assert iss.fetches > fetches
    # the dropped key stops working once the cached JWKS is refreshed (jwks_ttl = 2 s)
    deadline = time.monotonic() + 30
    while _post(env, old).status_code != 401:
        assert time.monotonic() < deadline, "the dropped key is still accepted"
        time.sleep(0.2)
    assert _post(env, new).status_code == 200


@pytest.mark.parametrize("extra, expect", [
    ('algorithms = ["none"]\n', "'none' is not accepted"),
    ('algorithms = ["HS256"]\n', "'HS256' is not accepted"),
    ('algorithms = []\n', "an empty list"),
])
def test_check_config_refuses_unsafe_algorithms(extra: str, expect: str) -> None:
    from toolatlas.config import parse
    from toolatlas.errors import ConfigError

    text = ('[http]\nlisten = "127.0.0.1:1"\n[http.oauth]\n'
            'issuers = [{issuer = "https://i", jwks_url = "https://i/jwks"}]\n' + extra)
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert expect in str(info.value)


def test_check_config_wants_https_for_a_remote_jwks() -> None:
    from toolatlas.config import parse
    from toolatlas.errors import ConfigError

    text = '[http]\nlisten = "127.0.0.1:1"\n[http.oauth]\nissuers = [{issuer = "i", jwks_url = "%s"}]\n'
    with pytest.raises(ConfigError, match="https://"):
        parse(text % "http://login.example.com/jwks")
    assert parse(text % "http://127.0.0.1:9/jwks").http.oauth.issuers[0].jwks_url == "http://127.0.0.1:9/jwks"


def test_each_endpoint_path_is_its_own_resource(env: Env) -> None:
    doc = httpx2.get(env.origin + "/.well-known/oauth-protected-resource/ops/mcp", timeout=30).json()
    assert doc["resource"] == f"{env.origin}/ops/mcp"
    ops_url = f"{env.origin}/ops/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}

    def post(token: str) -> httpx2.Response:
        return httpx2.post(ops_url, json=body, timeout=30,
                           headers={"Accept": ACCEPT, "Authorization": f"Bearer {token}"})

    iss = env.issuer
    kid = iss.published[-1]
    for_mcp = post(iss.token(kid, iss.claims(env.url, groups=["ops"])))  # audience: /mcp, not /ops/mcp
    assert for_mcp.status_code == 401 and "audience" in for_mcp.headers["www-authenticate"]
    assert f'resource_metadata="{env.origin}/.well-known/oauth-protected-resource/ops/mcp"' in \
        for_mcp.headers["www-authenticate"]
    assert post(iss.token(kid, iss.claims(ops_url, groups=["ops"]))).status_code == 200


def test_a_reload_that_changes_an_issuers_audience_ends_the_streams_its_tokens_no_longer_pass(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A stream opened with an OAuth token lived on after a reload changed its issuer's
    `audience` (or the accepted algorithms) until the token expired, though the token's next
    request was refused. It ends at the reload now; a stream whose token still passes the new
    settings, and a static token's, go on."""
    tmp = tmp_path_factory.mktemp("oauth-reload")
    port = free_port()
    with LocalIssuer() as issuer:
        issuer.add_key("rsa-1", "RS256")
        cfg = (f'[http]\nlisten = "127.0.0.1:{port}"\n'
               f'[[http.tokens]]\nname = "ops"\nsha256 = "{hash_token(STATIC)}"\n'
               f'[http.oauth]\nissuers = [{{issuer = "{issuer.issuer}", jwks_url = "{issuer.jwks_url}", '
               'audience = "api-one"}]\n'
               '[[access]]\ntokens = ["ops"]\nservers = ["*"]\n[[access]]\noauth_groups = ["ops"]\nservers = ["*"]\n'
               + stdio_testserver("alpha"))
        d = Daemon(tmp, cfg, daemon_extra='access_default = "deny"\n')
        with d:
            d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "ready")
            env = Env(d, issuer, port)
            only_one = issuer.token("rsa-1", issuer.claims("api-one", groups=["ops"], sub="one"))
            both = issuer.token("rsa-1", issuer.claims(["api-one", "api-two"], groups=["ops"], sub="both"))  # type: ignore[arg-type]
            streams = {"one": _event_stream(env, only_one), "both": _event_stream(env, both),
                       "static": _event_stream(env, STATIC)}
            d.config.write_text(d.config.read_text().replace('audience = "api-one"', 'audience = "api-two"'))
            d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
            assert _ended(streams["one"], 30), "the stream of a token the new audience refuses is still open"
            assert _post(env, only_one).status_code == 401 and _post(env, both).status_code == 200
            assert not _ended(streams["both"], 0.5) and not _ended(streams["static"], 0.5)
            for s in streams.values():
                s.close()
