"""The shim's session bookkeeping (surface.resume): what a new daemon connection is sent, what
the client is told, and which daemon lines are swallowed. Pure: lines in, lines out."""

from __future__ import annotations

import json
from typing import Any

from toolatlas.surface.resume import REPLAY_ID_PREFIX, SUBSCRIPTION_ID, Link, Session, read_daemon_line

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
DISCOVER = {"jsonrpc": "2.0", "id": "d1", "method": "server/discover", "params": {}}


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def decoded(lines: list[bytes]) -> list[dict[str, Any]]:
    assert all(x.endswith(b"\n") for x in lines)
    return [json.loads(x) for x in lines]


def result(id_: Any, body: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id_, "result": body or {}}, separators=(",", ":")).encode()


def up_legacy() -> Session:
    s = Session("/run/t.sock")
    assert s.connected().daemon == []  # nothing held: the first connection sends nothing
    assert decoded(s.from_client(line(INIT)).daemon) == [INIT]
    assert decoded(s.from_daemon(result(1, {"protocolVersion": "2025-11-25"})).client)[0]["id"] == 1
    s.from_client(line(INITIALIZED))
    return s


def test_legacy_session_is_replayed_under_a_swallowed_id() -> None:
    s = up_legacy()
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "tool_search"}}
    assert decoded(s.from_client(line(call)).daemon) == [call]

    errors = decoded(s.lost("the daemon closed the connection").client)
    assert [e["id"] for e in errors] == [2]
    assert errors[0]["error"]["code"] == -32000
    assert "in flight" in errors[0]["error"]["message"] and "may or may not have run" in errors[0]["error"]["message"]
    assert s.link is Link.DOWN

    refused = decoded(s.from_client(line({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).client)
    assert refused[0]["id"] == 3 and "restarting" in refused[0]["error"]["message"]
    assert "retry" in refused[0]["error"]["message"] and "/run/t.sock" in refused[0]["error"]["message"]

    out = s.connected()
    replayed = decoded(out.daemon)
    assert replayed[0]["method"] == "initialize" and replayed[0]["params"] == INIT["params"]
    assert str(replayed[0]["id"]).startswith(REPLAY_ID_PREFIX)
    assert replayed[1] == INITIALIZED
    assert decoded(out.client) == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}]
    # The replayed initialize's answer is the shim's, not the client's; the next one passes.
    assert s.from_daemon(result(replayed[0]["id"])).client == []
    assert s.from_daemon(result(4)).client == [result(4) + b"\n"]


def test_failed_handshake_is_not_replayed() -> None:
    s = Session("p")
    s.connected()
    s.from_client(line(INIT))
    error = json.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad version"}}).encode()
    s.from_daemon(error)
    s.lost("gone")
    assert s.connected() == ([], [])


def test_listen_streams_are_resent_and_their_new_ack_swallowed() -> None:
    s = Session("p")
    s.connected()
    s.from_client(line(DISCOVER))
    s.from_daemon(result("d1", {"supportedVersions": ["2026-07-28"]}))
    listen = {"jsonrpc": "2.0", "id": 7, "method": "subscriptions/listen",
              "params": {"notifications": {"toolsListChanged": True}}}
    other = {"jsonrpc": "2.0", "id": 8, "method": "subscriptions/listen",
             "params": {"notifications": {"promptsListChanged": True}}}
    s.from_client(line(listen))
    s.from_client(line(other))
    assert s.lost("reset").client == []  # open streams are not errored: they are resumed

    out = s.connected()
    sent = decoded(out.daemon)
    assert sent[0]["method"] == "server/discover" and str(sent[0]["id"]).startswith(REPLAY_ID_PREFIX)
    assert sent[1:] == [listen, other]
    # Tool changes only on the stream that asked for them, tagged as the daemon tags them.
    assert decoded(out.client) == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                                    "params": {"_meta": {SUBSCRIPTION_ID: 7}}}]
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
           "params": {"notifications": {"toolsListChanged": True}, "_meta": {SUBSCRIPTION_ID: 7}}}
    assert s.from_daemon(line(ack)).client == []
    assert s.from_daemon(line(ack)).client == [line(ack) + b"\n"]  # only the re-ack is the shim's


def test_a_cancelled_or_ended_listen_is_not_resumed() -> None:
    s = Session("p")
    s.connected()
    for i in (7, 8):
        s.from_client(line({"jsonrpc": "2.0", "id": i, "method": "subscriptions/listen",
                            "params": {"notifications": {"toolsListChanged": True}}}))
    s.from_client(line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}))
    s.from_daemon(result(8))  # the daemon ended stream 8 gracefully
    assert s.listens == {}
    s.lost("gone")
    assert s.connected() == ([], [])


def test_answers_to_a_lost_daemons_requests_are_dropped() -> None:
    s = up_legacy()
    ask = {"jsonrpc": "2.0", "id": 0, "method": "elicitation/create", "params": {}}
    assert s.from_daemon(line(ask)).client == [line(ask) + b"\n"]
    s.lost("gone")
    s.connected()
    assert s.from_client(line({"jsonrpc": "2.0", "id": 0, "result": {"action": "cancel"}})) == ([], [])


def test_first_handshake_is_held_until_the_daemon_answers() -> None:
    s = Session("p")
    assert s.from_client(line(INIT)) == ([], [])
    refused = decoded(s.from_client(line({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).client)
    assert "starting" in refused[0]["error"]["message"]
    s.down_reason = "the daemon this shim started exited with status 78 (see /s/daemon.log)"
    expired = decoded(s.expire_held().client)
    assert expired[0]["id"] == 1 and "status 78" in expired[0]["error"]["message"]

    s = Session("p")
    s.from_client(line(INIT))
    assert decoded(s.connected().daemon) == [INIT]
    assert s.pending == {1: ["initialize"]}


def test_daemon_lines_are_read_off_their_head() -> None:
    big = b'{"jsonrpc":"2.0","id":12,"result":{"content":[{"type":"text","text":"' + b"x" * 100_000 + b'"}]}}'
    assert read_daemon_line(big)[:2] == ("response", 12) and read_daemon_line(big).ok
    spaced = b'{"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "m"}}'
    assert read_daemon_line(spaced)[:2] == ("response", None)
    assert read_daemon_line(b'{"jsonrpc":"2.0","id":"a\\"b","method":"roots/list"}')[:2] == ("request", 'a"b')
    note = read_daemon_line(b'{"jsonrpc":"2.0","method":"notifications/progress","params":{}}')
    assert note.kind == "notification" and note.method == "notifications/progress"
    # Another key order falls back to decoding the line.
    assert read_daemon_line(b'{"result":{},"id":5,"jsonrpc":"2.0"}')[:2] == ("response", 5)
    assert read_daemon_line(b"not json").kind == "other"
