"""A SIGHUP reload applies every security-relevant key or is refused: a bearer token removed
from the config stops working at once, and an [http] listen change is refused by name."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from tests.support.daemon import Daemon, stdio_faultserver, stdio_testserver
from tests.support.ports import free_port, legacy_post

from toolatlas.surface.http import hash_token

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

KEEP, DROP = "token-that-stays", "token-that-is-removed"


def _section(port: int, *tokens: tuple[str, str]) -> str:
    out = f'[http]\nlisten = "127.0.0.1:{port}"\n'
    for name, secret in tokens:
        out += f'[[http.tokens]]\nname = "{name}"\nsha256 = "{hash_token(secret)}"\n'
    return out + '[[access]]\ntokens = ["keep", "drop"]\nservers = ["*"]\n'


def _status_code(url: str, secret: str) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": f"Bearer {secret}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/list"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _events(d: Daemon, name: str) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for line in d.log.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            out.append(json.loads(line))
    return out


def test_removed_token_stops_working_and_listen_change_is_refused(tmp_path: Path) -> None:
    port = free_port()
    upstream = stdio_testserver("one")
    d = Daemon(tmp_path, _section(port, ("keep", KEEP), ("drop", DROP)) + upstream)
    url = f"http://127.0.0.1:{port}/mcp"
    with d:
        assert _status_code(url, KEEP) == 200 and _status_code(url, DROP) == 200
        base = d.config.read_text()
        d.config.write_text(base.replace(f'[[http.tokens]]\nname = "drop"\nsha256 = "{hash_token(DROP)}"\n', ""))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: _status_code(url, DROP) == 401, 30, "the removed token refused")
        assert _status_code(url, KEEP) == 200
        # the rule still names it: the reload applied anyway, and the log says the name matches no one
        assert [ln for ln in d.log.read_text().splitlines() if "WARNING" in ln and "[[access]] rule 1 names token "
                "'drop'" in ln], d.log.read_text()[-3000:]

        # moving the endpoint cannot be applied live: refused by name, the running config kept
        other = free_port()
        d.config.write_text(d.config.read_text().replace(f"127.0.0.1:{port}", f"127.0.0.1:{other}"))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        rejected = d.wait_for(lambda: _events(d, "config_reload_rejected"), 30, "reload refused")
        assert "[http] listen" in rejected[-1]["reason"]
        assert _status_code(url, KEEP) == 200 and _status_code(url, DROP) == 401


class _Stream(threading.Thread):
    """One long-lived HTTP request read as an SSE stream: its `data:` lines, and `ended` once
    the daemon closed it. Never joined: a daemon thread the test's deadline bounds."""

    def __init__(self, port: int, method: str, headers: dict[str, str], body: dict | None = None) -> None:  # type: ignore[type-arg]
        super().__init__(daemon=True)
        self.port, self.method, self.headers, self.body = port, method, headers, body
        self.data: list[str] = []
        self.status: int | None = None
        self.ended = threading.Event()
        self.start()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(self.method, "/mcp", json.dumps(self.body) if self.body is not None else None, self.headers)
            resp = conn.getresponse()
            self.status = resp.status
            while line := resp.readline():
                if line.startswith(b"data:"):
                    self.data.append(line[5:].strip().decode())
        except OSError:
            pass
        finally:
            self.ended.set()
            conn.close()

    def heard(self, method: str) -> int:
        return sum(1 for d in self.data if f'"{method}"' in d)


def _legacy_stream(port: int, secret: str, lists: tuple[str, ...] = ("resources/list",)) -> _Stream:
    """A 2025-11-25 session opened with `secret`, listed its resources (or `lists`), and its
    standalone GET event stream."""
    status, sid = legacy_post(port, secret, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "legacy", "version": "1"}}})
    assert status == 200 and sid, status
    legacy_post(port, secret, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    for method in lists:
        assert legacy_post(port, secret, {"jsonrpc": "2.0", "id": 2, "method": method}, sid)[0] == 200
    return _Stream(port, "GET", {"Authorization": f"Bearer {secret}", "Accept": "text/event-stream",
                                 "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"})


def _listen_stream(port: int, secret: str, prompts: bool = False) -> _Stream:
    """A 2026-07-28 `subscriptions/listen` stream for resource (and `prompts`) list changes,
    opened with `secret`."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {
        "notifications": {"resourcesListChanged": True, **({"promptsListChanged": True} if prompts else {})},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "1"}}}}
    return _Stream(port, "POST", {
        "Authorization": f"Bearer {secret}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen"}, body)


def test_streams_opened_with_a_removed_token_end_at_the_reload(tmp_path: Path) -> None:
    """An event stream opened before the reload (a 2025-11-25 session's GET stream, a
    2026-07-28 listen stream) is as revoked as the token: it ends at once, and hears nothing
    more of the upstreams; streams of a token that stays go on."""
    port = free_port()
    d = Daemon(tmp_path, _section(port, ("keep", KEEP), ("drop", DROP))
               + stdio_testserver("alpha", "--name", "alpha", "--resources", "2"))
    changed = "notifications/resources/list_changed"
    with d:
        d.wait_for(lambda: d.status()["servers"][0]["state"] == "ready", 60, "alpha ready")
        streams = {(kind, name): opener(port, secret) for kind, opener in (("legacy", _legacy_stream),
                   ("listen", _listen_stream)) for name, secret in (("keep", KEEP), ("drop", DROP))}
        # every stream is live: each hears a change another client makes
        d.tool("alpha__add_resource", {"name": "before"})
        d.wait_for(lambda: all(s.heard(changed) for s in streams.values()), 30, "every stream hears the change")

        d.config.write_text(d.config.read_text().replace(
            f'[[http.tokens]]\nname = "drop"\nsha256 = "{hash_token(DROP)}"\n', ""))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: _events(d, "config_reloaded"), 30, "reload applied")
        for kind in ("legacy", "listen"):
            assert streams[(kind, "drop")].ended.wait(30), f"the {kind} stream of the removed token is still open"
        heard = {key: s.heard(changed) for key, s in streams.items()}
        d.tool("alpha__add_resource", {"name": "after"})
        d.wait_for(lambda: all(streams[(k, "keep")].heard(changed) > heard[(k, "keep")] for k in ("legacy", "listen")),
                   30, "the kept token's streams hear the next change")
        assert not streams[("legacy", "keep")].ended.is_set() and not streams[("listen", "keep")].ended.is_set()
        assert all(streams[(k, "drop")].heard(changed) == heard[(k, "drop")] for k in ("legacy", "listen"))


def _call(port: int, secret: str, name: str, arguments: dict) -> dict:  # type: ignore[type-arg]
    """One 2026-07-28 execute_tool over HTTP with bearer `secret`: the JSON-RPC response."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "execute_tool", "arguments": {"name": name, "arguments": arguments},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, method="POST", headers={
        "Authorization": f"Bearer {secret}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call", "Mcp-Name": "execute_tool"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = resp.read().decode()
    data = [ln[5:] for ln in raw.splitlines() if ln.startswith("data:")]
    return json.loads(data[-1] if data else raw)  # type: ignore[no-any-return]


def test_a_call_in_flight_to_an_upstream_a_reload_withdraws_ends_at_once(tmp_path: Path) -> None:
    """The token stays, but a reload takes `fs` out of its [[access]] rule while it has a call
    on fs in flight: that call ends at once (its caller told why, the upstream's handler
    cancelled, an access_denied recorded), as a removed token's requests do, instead of
    running on to its end with access the operator withdrew."""
    port = free_port()
    rules = ('[[access]]\nusers = ["root"]\nservers = ["*"]\n'
             '[[access]]\ntokens = ["keep"]\nservers = ["fs", "one"]\n')
    d = Daemon(tmp_path, _section(port, ("keep", KEEP)).replace('tokens = ["keep", "drop"]', 'tokens = ["nobody"]')
               + rules + stdio_faultserver("fs") + stdio_testserver("one"), daemon_extra='access_default = "deny"')
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")
        answer: list[dict] = []  # type: ignore[type-arg]
        caller = threading.Thread(target=lambda: answer.append(_call(port, KEEP, "fs__work", {"seconds": 90})),
                                  daemon=True)
        caller.start()
        d.wait_for(lambda: d.meta("fs__stats", {})["inflight"] == 1, 30, "the call in flight upstream")
        d.config.write_text(d.config.read_text().replace('servers = ["fs", "one"]', 'servers = ["one"]'))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        caller.join(30)
        assert answer, "the call of the withdrawn upstream is still running"
        result = answer[0]["result"]
        assert result["isError"] and "access" in result["content"][0]["text"], result
        d.wait_for(lambda: (s := d.meta("fs__stats", {}))["inflight"] == 0 and s["cancelled"] == 1, 30,
                   "the upstream's handler cancelled")
        denied = _events(d, "access_denied")
        assert [e for e in denied if e["principal"] == "token:keep" and e["target"] == "fs__work"], denied
        assert not _call(port, KEEP, "one__echo", {"message": "x"})["result"]["isError"]  # the rest goes on


def test_a_call_in_flight_on_an_upstream_the_reload_removes_is_no_access_denial(tmp_path: Path) -> None:
    """Removing the upstream itself withdraws nobody's access: its call in flight ends as the
    pool closes it (saying a reload closed it), with no access_denied against the caller."""
    fs = stdio_faultserver("fs")
    d = Daemon(tmp_path, fs + stdio_testserver("one"))
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")
        answer: list[dict] = []  # type: ignore[type-arg]
        caller = threading.Thread(target=lambda: answer.append(
            d.tool("execute_tool", {"name": "fs__work", "arguments": {"seconds": 90}})), daemon=True)
        caller.start()
        d.wait_for(lambda: d.meta("fs__stats", {})["inflight"] == 1, 30, "the call in flight upstream")
        d.config.write_text(d.config.read_text().replace(fs, ""))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        caller.join(60)
        assert answer and answer[0]["isError"], answer
        assert "config reload or a restart" in answer[0]["content"][0]["text"], answer
        assert _events(d, "access_denied") == []



def test_a_reload_tells_only_the_clients_whose_resources_or_prompts_it_changed(tmp_path: Path) -> None:
    """A SIGHUP that changes nobody's access tells no client to re-list its prompts (or
    resources; every reload used to, to every client); one that takes a server away from a
    token tells that token's streams."""
    port = free_port()
    d = Daemon(tmp_path, _section(port, ("keep", KEEP)).replace('tokens = ["keep", "drop"]', 'tokens = ["keep"]')
               + stdio_testserver("alpha", "--name", "alpha", "--resources", "2")
               + stdio_testserver("beta", "--name", "beta", "--resources", "1"))
    # Only a reload changes prompts here; a resource added is the marker that the reload's notices are all in.
    resources, prompts = "notifications/resources/list_changed", "notifications/prompts/list_changed"
    with d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstreams ready")
        streams = [_legacy_stream(port, KEEP, ("resources/list", "prompts/list")), _listen_stream(port, KEEP, True)]
        d.tool("alpha__add_resource", {"name": "before"})
        d.wait_for(lambda: all(s.heard(resources) for s in streams), 30, "every stream hears the change")
        marks = [s.heard(resources) for s in streams]

        d.config.write_text(d.config.read_text() + "\n# edited, nothing changed\n")
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: len(_events(d, "config_reloaded")) == 1, 30, "the first reload applied")
        d.tool("alpha__add_resource", {"name": "after"})
        d.wait_for(lambda: all(s.heard(resources) > m for s, m in zip(streams, marks)), 30, "the next change")
        assert [s.heard(prompts) for s in streams] == [0, 0], "a reload that changed nothing told clients to re-list"

        d.config.write_text(d.config.read_text().replace('servers = ["*"]', 'servers = ["beta"]'))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: all(s.heard(prompts) for s in streams), 30,
                   "the streams of the token that lost alpha hear their prompts changed")
