"""The MCP surface in process: the real SDK client against `Surface` over memory streams,
with a fake gateway behind the port (the surface is the unit under test here; the real
gateway is tested in the integration and e2e layers)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared._context_streams import create_context_streams
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage

from toolatlas.calls import CallOutcome, CallRequest, InputRequired, UpstreamReply
from toolatlas.catalog.model import ToolRecord
from toolatlas.errors import BadInput, UpstreamUnavailable
from toolatlas.gateway.ports import Connection
from toolatlas.guidance import MetaTools, default_meta_tools
from toolatlas.surface import federation
from toolatlas.surface.server import CONNECTION, STARTING, Surface, init_options

DENIED_UID = 4242
RECORDS = [
    ToolRecord.make("notes", "add_note", "Add a note.", {"type": "object", "properties": {"text": {"type": "string"}}},
                    title="Add note", output_schema={"type": "object"},
                    annotations={"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False}),
    ToolRecord.make("vault", "read_secret", "Read a secret.", {"type": "object"}),
]


class FakeGateway:
    """Answers the port from a fixed catalog; `vault` is denied to DENIED_UID."""

    def __init__(self) -> None:
        self.calls: list[tuple[CallRequest, Connection]] = []
        self.listed: list[tuple[bool, int]] = []
        self.passthrough = False
        self.starting = False
        self.bad_messages = 0

    @property
    def default_top_k(self) -> int:
        return 5

    def instructions(self, conn: Connection | None) -> str:
        return "fake gateway over " + (", ".join(sorted(self._allowed(conn))) if conn else "nothing")

    def _allowed(self, conn: Connection) -> set[str]:
        return {"notes"} if conn.uid == DENIED_UID else {"notes", "vault"}

    def passthrough_for(self, conn: Connection) -> bool:
        return self.passthrough

    def meta_tools(self, conn: Connection) -> MetaTools:
        return default_meta_tools("test", sorted(self._allowed(conn)))

    def visible_records(self, conn: Connection) -> list[ToolRecord]:
        return [r for r in RECORDS if r.server in self._allowed(conn)]

    def tools_listed(self, conn: Connection, *, passthrough: bool, tools: int) -> None:
        self.listed.append((passthrough, tools))

    def bad_message(self) -> None:
        self.bad_messages += 1

    async def search(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any]:
        if servers and set(servers) - self._allowed(conn):
            raise BadInput(f"unknown server(s) {', '.join(sorted(set(servers) - self._allowed(conn)))}")
        matches = [{"name": r.name, "server": r.server, "tool": r.tool, "description": r.description,
                    "inputSchema": r.input_schema, "score": 1.0} for r in self.visible_records(conn)]
        return {"query": query, "matches": matches[: top_k or self.default_top_k], "degraded": None}

    def search_cached(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any] | None:
        return None

    async def execute(self, call: CallRequest, conn: Connection) -> CallOutcome:
        self.calls.append((call, conn))
        names = {r.name for r in self.visible_records(conn)}
        if call.name not in names:
            raise BadInput(f"unknown tool {call.name!r}. Use tool_search to find tools.")
        if call.name == "notes__add_note" and call.arguments == {"text": "down"}:
            raise UpstreamUnavailable("server 'notes' is not available right now (degraded); try again later")
        if call.allow_input_required and call.request_state is None and call.arguments == {"text": "ask"}:
            return UpstreamReply(input_required=InputRequired(input_requests={}, request_state="sealed-1"))
        text = f"added {call.arguments!r}"
        return UpstreamReply(payload=types.CallToolResult(content=[types.TextContent(type="text", text=text)]))

    def status(self, conn: Connection) -> Mapping[str, Any]:
        return {"servers": sorted(self._allowed(conn)), "clients": 0}


@asynccontextmanager
async def connected(surface: Surface, conn: Connection, mode: str = "legacy") -> AsyncIterator[Client]:
    """The SDK client on memory streams, served as the Unix socket serves a connection."""
    async with create_client_server_memory_streams() as (client_streams, server_streams):
        async with anyio.create_task_group() as tg:

            async def serve() -> None:
                # As the socket's accept loop does: the connection is current in this task,
                # and the SDK's context streams carry it with each message to the handlers.
                token = CONNECTION.set(conn)
                surface.connections.add(conn)
                to_server, server_read = create_context_streams[SessionMessage | Exception](0)

                async def pump() -> None:
                    async with to_server:
                        async for message in server_streams[0]:
                            await to_server.send(message)

                try:
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(pump)
                        await surface.server.run(server_read, server_streams[1], init_options(surface.server))
                        inner.cancel_scope.cancel()
                finally:
                    surface.connections.discard(conn)
                    CONNECTION.reset(token)

            tg.start_soon(serve)

            @asynccontextmanager
            async def transport() -> AsyncIterator[Any]:
                yield client_streams

            async with Client(transport(), mode=mode) as client:  # type: ignore[arg-type]
                yield client
            tg.cancel_scope.cancel()


def _json(result: types.CallToolResult) -> Any:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return json.loads(block.text)


@pytest.fixture
def fake() -> FakeGateway:
    return FakeGateway()


async def test_lists_the_three_meta_tools(fake: FakeGateway) -> None:
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=1000)) as client:
            listed = await client.list_tools()
            assert surface.client_count() == 1
    assert [t.name for t in listed.tools] == ["tool_search", "execute_tool", "catalog_status"]
    assert fake.listed == [(False, 3)]
    assert surface.client_count() == 0


async def test_passthrough_lists_full_definitions_scoped_by_access(fake: FakeGateway) -> None:
    fake.passthrough = True
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=DENIED_UID)) as client:
            listed = await client.list_tools()
    assert [t.name for t in listed.tools] == ["notes__add_note"]
    tool = listed.tools[0]
    assert tool.title == "Add note" and tool.output_schema == {"type": "object"}
    # as a direct connection lists it: a client deciding what to confirm reads the hints
    assert tool.annotations is not None and tool.annotations.model_dump(exclude_none=True) == {
        "read_only_hint": False, "destructive_hint": False, "idempotent_hint": False}


async def test_search_answer_and_bad_input(fake: FakeGateway) -> None:
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=1000)) as client:
            ok = await client.call_tool("tool_search", {"query": "add a note", "top_k": 1})
            empty = await client.call_tool("tool_search", {"query": "  "})
            bad_k = await client.call_tool("tool_search", {"query": "x", "top_k": "many"})
            bad_servers = await client.call_tool("tool_search", {"query": "x", "servers": "notes"})
    assert not ok.is_error and _json(ok)["matches"][0]["name"] == "notes__add_note"
    assert ok.structured_content == _json(ok) and len(_json(ok)["matches"]) == 1
    assert empty.is_error and "non-empty string `query`" in empty.content[0].text  # type: ignore[union-attr]
    assert bad_k.is_error and "top_k must be an integer" in bad_k.content[0].text  # type: ignore[union-attr]
    # a lone name written as a string: the error shows how to write it
    assert bad_servers.is_error and bad_servers.content[0].text == (  # type: ignore[union-attr]
        '`servers` must be a list of server names: write ["notes"]')


async def test_compact_format_is_a_short_text_listing(fake: FakeGateway) -> None:
    """issue 18 item 4: `format: "compact"` answers with text only, one line per match with its
    parameter signature; a format it does not know is an error a model reads."""
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=1000)) as client:
            full = await client.call_tool("tool_search", {"query": "add a note"})
            compact = await client.call_tool("tool_search", {"query": "add a note", "format": "compact"})
            bad = await client.call_tool("tool_search", {"query": "add a note", "format": "yaml"})
    text = compact.content[0].text  # type: ignore[union-attr]
    assert not compact.is_error and compact.structured_content is None and len(compact.content) == 1
    assert text.splitlines()[:2] == ["1. notes__add_note(text?: string)", "   Add a note."]
    assert "2. vault__read_secret()" in text and "execute_tool" in text
    assert len(text) < len(full.content[0].text) / 2  # type: ignore[union-attr]
    assert bad.is_error and "format must be one of json, compact" in bad.content[0].text  # type: ignore[union-attr]


async def test_execute_routes_one_call_value_and_passes_the_result_through(fake: FakeGateway) -> None:
    surface = Surface(fake)
    conn = Connection(id=7, uid=1000)
    with anyio.fail_after(10):
        async with connected(surface, conn) as client:
            via_meta = await client.call_tool("execute_tool", {"name": "notes__add_note", "arguments": {"text": "hi"}})
            direct = await client.call_tool("notes__add_note", {"text": "direct"})
            no_name = await client.call_tool("execute_tool", {"arguments": {}})
    assert via_meta.content[0].text == "added {'text': 'hi'}"  # type: ignore[union-attr]
    assert direct.content[0].text == "added {'text': 'direct'}"  # type: ignore[union-attr]
    assert no_name.is_error and "execute_tool needs `name`" in no_name.content[0].text  # type: ignore[union-attr]
    (first, first_conn), (second, _) = fake.calls
    assert first.name == "notes__add_note" and first.arguments == {"text": "hi"} and first_conn is conn
    assert first.progress is not None and not first.allow_input_required  # a legacy session
    assert second.name == "notes__add_note" and second.arguments == {"text": "direct"}


async def test_access_denial_and_unavailable_upstream_are_results_a_model_reads(fake: FakeGateway) -> None:
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=DENIED_UID)) as client:
            denied = await client.call_tool("execute_tool", {"name": "vault__read_secret"})
            scoped = await client.call_tool("tool_search", {"query": "secret", "servers": ["vault"]})
            down = await client.call_tool("notes__add_note", {"text": "down"})
            status = await client.call_tool("catalog_status", {})
    assert denied.is_error and "unknown tool 'vault__read_secret'" in denied.content[0].text  # type: ignore[union-attr]
    assert scoped.is_error and "unknown server(s) vault" in scoped.content[0].text  # type: ignore[union-attr]
    assert down.is_error and "not available right now" in down.content[0].text  # type: ignore[union-attr]
    assert _json(status)["servers"] == ["notes"]


async def test_modern_session_gets_input_required_with_the_gateway_state(fake: FakeGateway) -> None:
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=1000), mode="auto") as client:
            result = await client.session.call_tool("notes__add_note", {"text": "ask"}, allow_input_required=True)  # type: ignore[attr-defined]
    assert isinstance(result, types.InputRequiredResult) and result.request_state == "sealed-1"
    assert fake.calls[0][0].allow_input_required


async def test_instructions_are_per_caller_and_follow_the_gateway(fake: FakeGateway) -> None:
    """#15 item 6: instructions name only the upstreams the caller may use, computed when its
    session initializes (so a reload's upstreams show without any refresh call)."""
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=1000)) as client:
            assert client.instructions == "fake gateway over notes, vault"
        async with connected(surface, Connection(id=2, uid=DENIED_UID)) as client:
            assert client.instructions == "fake gateway over notes"
        fake.instructions = lambda conn: "after reload: notes"  # type: ignore[method-assign]
        async with connected(surface, Connection(id=3, uid=1000)) as client:
            assert client.instructions == "after reload: notes"
        # read once per session: one that starts while upstreams still list is told the count is not final
        fake.starting = True
        async with connected(surface, Connection(id=4, uid=1000)) as client:
            assert client.instructions == "after reload: notes\n" + STARTING
            assert "still starting" in STARTING and "tools/list_changed" in STARTING


async def test_a_meta_tool_key_it_has_no_parameter_for_is_named_not_ignored(fake: FakeGateway) -> None:
    """A model that puts a tool's arguments beside `name` (not inside `arguments`) had the tool
    called with none; one that writes `server` for `servers` searched every server."""
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=1000)) as client:
            flat = await client.call_tool("execute_tool", {"name": "notes__add_note", "text": "hi"})
            search = await client.call_tool("tool_search", {"query": "add a note", "server": "vault"})
            fine = await client.call_tool("execute_tool", {"name": "notes__add_note", "arguments": {"text": "ok"}})
    assert flat.is_error and fake.calls[0][0].arguments == {"text": "ok"} and len(fake.calls) == 1
    assert flat.content[0].text == ('execute_tool has no parameter "text"; it takes name, arguments. '  # type: ignore[union-attr]
                                    "Put the tool's own arguments inside `arguments`.")
    assert search.is_error and search.content[0].text == (  # type: ignore[union-attr]
        'tool_search has no parameter "server"; it takes query, top_k, servers, format.')
    assert not fine.is_error


async def test_a_bad_top_k_or_format_is_quoted_short(fake: FakeGateway) -> None:
    """A 100 KB top_k or format string was echoed whole in the error."""
    surface = Surface(fake)
    with anyio.fail_after(10):
        async with connected(surface, Connection(id=1, uid=1000)) as client:
            top_k = await client.call_tool("tool_search", {"query": "x", "top_k": "9" * 100_000})
            form = await client.call_tool("tool_search", {"query": "x", "format": ["y"] * 100_000})
    assert top_k.content[0].text == "top_k must be an integer from 1 to 20, got '" + "9" * 59 + "..."  # type: ignore[union-attr]
    assert form.content[0].text.startswith("format must be one of json, compact, got ['y', 'y'")  # type: ignore[union-attr]
    assert len(form.content[0].text) < 200  # type: ignore[union-attr]


class _Session:
    """A client session's notification side: `stuck` never finishes one (a client that is not
    reading); otherwise each notification is recorded as it arrives."""

    def __init__(self, stuck: bool) -> None:
        self.stuck = stuck
        self.got: list[str] = []
        self.arrived = anyio.Event()
        self.given_up = False  # a stuck send was cancelled

    async def _note(self, kind: str) -> None:
        self.got.append(kind)
        self.arrived.set()
        if self.stuck:
            try:
                await anyio.sleep_forever()
            finally:
                self.given_up = True

    async def send_tool_list_changed(self) -> None:
        await self._note("tools")

    async def send_resource_list_changed(self) -> None:
        await self._note("resources")

    async def send_prompt_list_changed(self) -> None:
        await self._note("prompts")


@pytest.mark.parametrize("kind", ["tools", "resources", "prompts"])
async def test_a_client_that_is_not_reading_delays_no_other_clients_list_changed(
        fake: FakeGateway, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """list_changed went to clients one after another, each bounded at 2 s: N stuck clients
    ahead of a reading one held its notification (and the upstream's listen loop) 2N s. The
    reading client must hear it while the stuck ones are still being waited for."""
    monkeypatch.setattr(federation, "NOTIFY_BOUND_S", 300.0)
    fake.passthrough = True
    surface = Surface(fake)
    sessions = [_Session(stuck=True), _Session(stuck=True), _Session(stuck=False)]
    for i, session in enumerate(sessions):  # the stuck ones first, in the order they are told
        surface.connections.add(Connection(id=i + 1, uid=1000, session=session, saw_passthrough=True))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            if kind == "tools":
                tg.start_soon(surface.tools_changed)
            else:
                tg.start_soon(surface.relays.tell, kind, lambda conn: True)
            await sessions[2].arrived.wait()
            assert [s.got for s in sessions] == [[kind]] * 3  # the stuck ones were told too
            assert not sessions[0].given_up and not sessions[1].given_up
            tg.cancel_scope.cancel()


async def test_a_stuck_clients_list_changed_is_given_up_after_the_bound(fake: FakeGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(federation, "NOTIFY_BOUND_S", 0.05)
    fake.passthrough = True
    surface = Surface(fake)
    stuck = _Session(stuck=True)
    surface.connections.add(Connection(id=1, uid=1000, session=stuck, saw_passthrough=True))
    with anyio.fail_after(10):
        await surface.tools_changed()  # returns: the one stuck client was given up
        await surface.relays.tell("prompts", lambda conn: True)
    assert stuck.got == ["tools", "prompts"] and stuck.given_up
