"""The sliced parse of a large tools/list answer (upstream/pages.py, issue #15 item 8): the same
tools as the SDK's own parse, a stand-in the SDK cannot cache, errors named per tool."""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types
import pytest

from tests.support.servers.hostile import many_tools
from toolatlas.upstream import pages
from toolatlas.upstream.pages import BIG_PAGE_BYTES, META_KEY, PAGES, PageStash, parse_big_page

# Part of the hostile suite (#15 item 8): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile


def listing_line(n: int, request_id: int | str = 7, **result: Any) -> bytes:
    tools = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in many_tools(n)]
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools, **result}}).encode()


async def test_a_large_answer_yields_the_tools_the_sdk_would_parse() -> None:
    line = listing_line(3000, nextCursor="c2", ttlMs=60000, _meta={"x.example/k": 1})
    assert len(line) > BIG_PAGE_BYTES
    pending: set[int | str] = {7, 8}
    with anyio.fail_after(30):
        stand_in = await parse_big_page(line, pending)
    assert isinstance(stand_in, mcp_types.JSONRPCResponse) and stand_in.id == 7
    assert pending == {8}
    result = stand_in.result
    assert result["tools"] == [] and result["nextCursor"] == "c2"
    assert result["ttlMs"] == 0  # the SDK's response cache must never keep the empty stand-in
    assert result["_meta"]["x.example/k"] == 1
    tools = pages.PAGES.take(result["_meta"])
    expected = mcp_types.ListToolsResult.model_validate_json(json.dumps(json.loads(line)["result"])).tools
    assert tools is not None and [t.model_dump() for t in tools] == [t.model_dump() for t in expected]
    with pytest.raises(LookupError, match="no longer held"):
        pages.PAGES.take(result["_meta"])


async def test_small_answers_and_answers_to_other_requests_take_the_ordinary_path() -> None:
    assert await parse_big_page(listing_line(10), {7}) is None
    pending: set[int | str] = {8}
    assert await parse_big_page(listing_line(3000, request_id=7), pending) is None
    assert pending == {8}
    assert await parse_big_page(b"{" + b" " * BIG_PAGE_BYTES, {7}) is None  # not JSON: the ordinary parse reports it


async def test_an_invalid_tool_fails_the_request_naming_the_tool() -> None:
    # Wrong below the tool's top level, where toolrepair does not look.
    doc = json.loads(listing_line(3000, request_id="L1"))
    doc["result"]["tools"][1234]["icons"] = [{"src": 5}]
    pending: set[int | str] = {"L1"}
    answer = await parse_big_page(json.dumps(doc).encode(), pending)
    assert isinstance(answer, mcp_types.JSONRPCError) and answer.id == "L1"
    assert answer.error.message.startswith("invalid tools/list result: tool 1234: icons"), answer.error.message
    assert pending == set()


async def test_a_tool_broken_at_its_top_level_is_repaired_or_dropped() -> None:
    doc = json.loads(listing_line(3000, request_id="L2"))
    del doc["result"]["tools"][1234]["inputSchema"]
    doc["result"]["tools"][99] = "not a tool"
    answer = await parse_big_page(json.dumps(doc).encode(), {"L2"})
    assert isinstance(answer, mcp_types.JSONRPCResponse), answer
    tools = PAGES.take(answer.result["_meta"])
    assert tools is not None and len(tools) == 2999
    (repaired,) = [t for t in tools if t.name == doc["result"]["tools"][1234]["name"]]
    assert repaired.input_schema == {"type": "object"} and repaired.meta is not None
    assert repaired.meta["dev.toolatlas/problems"][0].startswith("inputSchema is missing; replaced"), repaired.meta


def test_the_stash_is_bounded_and_ordinary_pages_pass() -> None:
    stash = PageStash(limit=2)
    tokens = [stash.put([]) for _ in range(3)]
    assert len(stash) == 2
    with pytest.raises(LookupError):
        stash.take({META_KEY: tokens[0]})
    assert stash.take({META_KEY: tokens[2]}) == []
    assert stash.take(None) is None and stash.take({"other": 1}) is None
