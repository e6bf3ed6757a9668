"""The raw relay of execute_tool and direct calls (surface/relay.py, upstream/relay.py)
against the SDK path it stands in for.

Two daemons on the same config, each with its own copy of the test server over stdio: one
relays (the default), one has the relay off (`TOOLATLAS_RAW_RELAY=0`). The same requests,
with the same ids, go to both over plain sockets, in both protocol eras; every line that
comes back (progress notifications and the response) must be the same bytes. The relay
daemon logs at DEBUG, so the test also checks that the relay, not the SDK, answered there.
Then what only the relay daemon shows: a client's notifications/cancelled and a client
going away cancel a relayed call, and the daemon goes on serving.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.support.daemon import Daemon, everything_upstream, hostile_upstream, stdio_testserver
from toolatlas.jsonlines import BoundedLines
from toolatlas.surface.unix import unix_client

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "relay-test", "version": "1"},
}
# The project's test server (Python SDK, 2026-07-28), npm's server-everything (TypeScript,
# 2025-11-25) and the hostile server's tools whose results meet, break or meet a catastrophic
# `pattern` in their own outputSchema.
CONFIG = (stdio_testserver("ts", "--blob", "--resources", "2") + "timeouts = { call = 1.5 }\nmax_result_bytes = 200000\n"
          + everything_upstream("ev") + hostile_upstream("--outputs", name="ho"))


class Wire:
    """A plain socket to the daemon speaking JSON-RPC lines, in one protocol era."""

    def __init__(self, path: str, era: str, capabilities: dict[str, Any] | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.era = era
        self._lines = BoundedLines(64 * 1024 * 1024)
        self._ready: list[Any] = []
        if era == LEGACY:
            self.request(0, "initialize", {"protocolVersion": LEGACY, "capabilities": capabilities or {},
                                           "clientInfo": {"name": "relay-test", "version": "1"}})
            self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        # The relay takes calls only once the SDK has let the connection through its gate.
        self.request(1, "tools/list", {})

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def params(self, params: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
        meta = dict(meta or {})
        if self.era == MODERN:
            meta.update(ENVELOPE)
        return {**params, "_meta": meta} if meta else params

    def request(self, id_: Any, method: str, params: dict[str, Any], meta: dict[str, Any] | None = None) -> list[bytes]:
        """Send one request; every line up to and including its response."""
        self.send({"jsonrpc": "2.0", "id": id_, "method": method, "params": self.params(params, meta)})
        return self.until(id_)

    def until(self, id_: Any, deadline: float = 30.0) -> list[bytes]:
        out: list[bytes] = []
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            line = self.line()
            out.append(line)
            msg = json.loads(line)
            if msg.get("id") == id_ and "method" not in msg:
                return out
        raise TimeoutError(f"no response to {id_!r} within {deadline} s; got {out!r}")

    def line(self) -> bytes:
        while not self._ready:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the daemon closed the connection")
            self._ready = self._lines.feed(data)
        line = self._ready.pop(0)
        assert isinstance(line, bytes), line
        return line

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    relay = Daemon(tmp_path_factory.mktemp("relay"), CONFIG, daemon_extra='log_level = "DEBUG"')
    sdk = Daemon(tmp_path_factory.mktemp("sdk"), CONFIG)
    with relay.start(), sdk.start(env={"TOOLATLAS_RAW_RELAY": "0"}):
        yield relay, sdk


WEIRD = 'héllo \u0001 "quoted" \\ / 日本 😀 \u2028 1e400'
CALLS: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("execute_tool", {"name": "ts__echo", "arguments": {"message": "hi"}}, None),
    ("execute_tool", {"name": "ts__echo", "arguments": {"message": WEIRD}}, None),
    ("execute_tool", {"name": "ts__echo", "arguments": json.dumps({"message": "as a string"})}, None),
    ("ts__echo", {"message": "called directly"}, None),
    ("execute_tool", {"name": "ts__link", "arguments": {"name": "thing"}}, None),
    ("execute_tool", {"name": "ts__blob", "arguments": {"size": 150_000}}, None),
    ("execute_tool", {"name": "ts__blob", "arguments": {"size": 300_000}}, None),  # over max_result_bytes
    ("execute_tool", {"name": "ts__progress", "arguments": {"steps": 3}}, {"progressToken": "tok-7"}),
    ("execute_tool", {"name": "ts__progress", "arguments": {"steps": 2}}, {"progressToken": 99}),
    ("execute_tool", {"name": "ts__echo", "arguments": {"message": 5}}, None),  # fails its inputSchema
    ("execute_tool", {"name": "ts__ech", "arguments": {}}, None),  # unknown: a suggestion
    ("execute_tool", {"name": "ts__hang", "arguments": {}}, None),  # the upstream's call timeout
    ("execute_tool", {"name": "ev__echo", "arguments": {"message": WEIRD}}, None),
    ("ev__get-sum", {"a": 2, "b": 3.5}, None),
    ("execute_tool", {"name": "ev__get-tiny-image", "arguments": {}}, None),
    ("execute_tool", {"name": "ev__get-annotated-message", "arguments": {"messageType": "error", "includeImage": True}}, None),
    ("execute_tool", {"name": "ev__get-resource-links", "arguments": {"count": 2}}, None),
    ("execute_tool", {"name": "ev__get-resource-reference", "arguments": {"resourceType": "Text", "resourceId": 2}}, None),
    ("execute_tool", {"name": "ev__get-structured-content", "arguments": {"location": "New York"}}, None),
    ("execute_tool", {"name": "ev__trigger-long-running-operation", "arguments": {"duration": 0.3, "steps": 3}},
     {"progressToken": "long"}),
    ("execute_tool", {"name": "ho__good_output", "arguments": {}}, None),
    ("execute_tool", {"name": "ho__bad_output", "arguments": {}}, None),  # breaks its outputSchema
    ("execute_tool", {"name": "ho__evil_output", "arguments": {}}, None),  # a catastrophic pattern, bounded
    ("execute_tool", {"name": "ts__crash", "arguments": {"code": 3}}, None),  # the session lost mid-call
]


# server-everything's get-resource-reference makes its resource on each call and stamps the
# wall-clock second into its text: two calls a second apart differ there, and only there.
_CLOCK = re.compile(rb"created at \d{1,2}:\d{2}:\d{2}(?:\s|\xe2\x80\xaf|\\u202f)?[AP]M")


def _unclocked(lines: list[bytes]) -> list[bytes]:
    return [_CLOCK.sub(b"created at <time>", line) for line in lines]


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_same_bytes_out_as_the_sdk_path(daemons: tuple[Daemon, Daemon], era: str) -> None:
    relay, sdk = daemons
    a, b = Wire(relay.socket, era), Wire(sdk.socket, era)
    try:
        for i, (name, args, meta) in enumerate(CALLS, start=100):
            if name == "execute_tool" and args["name"] == "ts__crash":
                continue  # below, once the others are compared
            got = a.request(i, "tools/call", {"name": name, "arguments": args}, meta)
            want = b.request(i, "tools/call", {"name": name, "arguments": args}, meta)
            assert _unclocked(got) == _unclocked(want), (name, args)
            reply = json.loads(got[-1])
            assert "result" in reply, reply
        # The relay answered those on the relay daemon (its DEBUG log names each relayed id).
        assert relay.log.read_text().count("tools/call relayed as ta-relay-") >= 17
        # A few checks that the compared answers are the right ones, not just equal.
        first = json.loads(a.request(200, "tools/call", {"name": "execute_tool", "arguments": CALLS[0][1]})[-1])
        assert first["result"]["content"][0]["text"] == "Echo: hi"
        assert first["result"]["structuredContent"] == {"result": "Echo: hi"}
        progress = a.request(201, "tools/call", {"name": "execute_tool", "arguments": CALLS[7][1]}, CALLS[7][2])
        assert [json.loads(p)["params"]["progressToken"] for p in progress[:-1]] == ["tok-7"] * 3
        for at, (tool, text) in enumerate([("evil", "evil_output"), ("bad", "Invalid structured content returned by "
                                           "tool bad_output: 'not an integer' is not of type 'integer'")]):
            out = json.loads(a.request(202 + at, "tools/call", {"name": "execute_tool",
                                                                "arguments": {"name": f"ho__{tool}_output", "arguments": {}}})[-1])
            assert out["result"]["isError"] and text in out["result"]["content"][0]["text"], out
    finally:
        a.close()
        b.close()


def test_a_lost_session_reads_the_same_and_the_upstream_comes_back(daemons: tuple[Daemon, Daemon]) -> None:
    relay, sdk = daemons
    name, args, _ = CALLS[-1]
    answers = []
    for d in (relay, sdk):
        w = Wire(d.socket, MODERN)
        try:
            answers.append(w.request(300, "tools/call", {"name": name, "arguments": args}))
        finally:
            w.close()
    assert answers[0] == answers[1]
    assert "lost its session" in json.loads(answers[0][-1])["result"]["content"][0]["text"]
    for d in (relay, sdk):
        d.wait_for(lambda d=d: d.tool("execute_tool", {"name": "ts__echo", "arguments": {"message": "back"}})
                   .get("content", [{}])[0].get("text") == "Echo: back", timeout=60, what="ts back after its crash")


def test_cancel_and_disconnect_end_a_relayed_call(daemons: tuple[Daemon, Daemon]) -> None:
    relay, _ = daemons
    w = Wire(relay.socket, MODERN)
    before = relay.log.read_text().count("relayed as")
    try:
        w.send({"jsonrpc": "2.0", "id": "h1", "method": "tools/call",
                "params": w.params({"name": "execute_tool", "arguments": {"name": "ts__sleep", "arguments": {"seconds": 20}}})})
        relay.wait_for(lambda: relay.log.read_text().count("relayed as") > before, what="the sleep relayed")
        w.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": w.params({"requestId": "h1"})})
        # No response to h1 comes; the next call is answered at once (the upstream slot is free).
        lines = w.request("e1", "tools/call", {"name": "execute_tool", "arguments": {"name": "ts__echo",
                                                                                       "arguments": {"message": "next"}}})
        assert all(json.loads(x).get("id") != "h1" for x in lines), lines
        assert json.loads(lines[-1])["result"]["content"][0]["text"] == "Echo: next"
        relay.wait_for(lambda: "request 'h1' cancelled by the client" in relay.log.read_text(), what="h1 cancelled")
    finally:
        w.close()
    # A caller that goes away mid-call: its call is cancelled, the daemon serves the next one.
    before = relay.log.read_text().count("relayed as")
    gone = Wire(relay.socket, LEGACY)
    gone.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "execute_tool", "arguments": {"name": "ts__sleep", "arguments": {"seconds": 20}}}})
    relay.wait_for(lambda: relay.log.read_text().count("relayed as") > before, what="the second sleep relayed")
    gone.close()
    assert relay.tool("execute_tool", {"name": "ts__echo", "arguments": {"message": "still"}})["content"][0]["text"] \
        == "Echo: still"


def test_a_question_open_when_its_call_ends_is_withdrawn(daemons: tuple[Daemon, Daemon]) -> None:
    """A 2025-era upstream's elicitation/create reaches a 2025-era caller as the same request;
    when the call ends before the answer (cancelled here, or cut by its timeout), the caller
    is told to drop the question, as for a 2026-07-28 upstream's."""
    relay, _ = daemons
    w = Wire(relay.socket, LEGACY, capabilities={"elicitation": {}})
    try:
        w.send({"jsonrpc": "2.0", "id": "q1", "method": "tools/call",
                "params": {"name": "ev__trigger-elicitation-request", "arguments": {}}})
        question = json.loads(w.line())
        assert question["method"] == "elicitation/create", question
        w.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "q1"}})
        w.sock.settimeout(10)
        withdrawn = json.loads(w.line())
        assert withdrawn["method"] == "notifications/cancelled", withdrawn
        assert withdrawn["params"]["requestId"] == question["id"], withdrawn
        w.sock.settimeout(30)
        lines = w.request("q2", "tools/call", {"name": "ts__echo", "arguments": {"message": "next"}})
        assert json.loads(lines[-1])["result"]["content"][0]["text"] == "Echo: next"
    finally:
        w.close()


async def test_a_question_left_unanswered_does_not_stop_the_next(daemons: tuple[Daemon, Daemon]) -> None:
    """A 2026-07-28 client that leaves a 2025-era upstream's question (input_required)
    unanswered and calls again is asked again: the call still waiting for its answer is not
    the one asking, though MCP 2025-11-25 does not say which call asked."""
    relay, _ = daemons

    async def decline(_ctx: object, _params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    with anyio.fail_after(30):
        async with Client(unix_client(relay.socket), elicitation_callback=decline) as client:
            for _ in range(2):
                left = await client.session.call_tool("ev__trigger-elicitation-request", {}, allow_input_required=True)
                assert isinstance(left, types.InputRequiredResult), left


def test_a_tool_that_needs_mcp_tasks_is_not_offered(daemons: tuple[Daemon, Daemon]) -> None:
    """server-everything's simulate-research-query has execution.taskSupport 'required':
    toolatlas does not run task-augmented calls, so every call of it would fail. It is not
    offered (search, passthrough, calls), and the operator's log says why."""
    relay, _ = daemons
    assert "ev__simulate-research-query" not in relay.search("simulate a research query", top_k=20)
    assert "ev__get-sum" in relay.search("get the sum of two numbers", top_k=20)  # the rest is
    log = relay.log.read_text()
    assert "need MCP task augmentation (execution.taskSupport 'required')" in log
    assert "simulate-research-query" in log


def test_a_call_cut_while_the_user_answers_says_so(daemons: tuple[Daemon, Daemon]) -> None:
    """ts's call timeout (1.5 s) passes while its question waits for the caller: the error
    says the upstream was waiting for the answer, not that it did not answer."""
    relay, _ = daemons
    w = Wire(relay.socket, LEGACY, capabilities={"elicitation": {}})
    try:
        w.send({"jsonrpc": "2.0", "id": "u1", "method": "tools/call", "params": {"name": "ts__greet_user", "arguments": {}}})
        assert json.loads(w.line())["method"] == "elicitation/create"
        text = json.loads(w.until("u1")[-1])["result"]["content"][0]["text"]
        assert "waiting for the answer to its question" in text and "timeouts.call" in text, text
    finally:
        w.close()
