"""Ingest bounds (issue #15 item 8): an upstream's outsized description or schema is cut to
the upstream's bound when it becomes a ToolRecord, and the record says what was cut."""

from __future__ import annotations

import pytest
from typing import Any

import mcp_types

from toolatlas.upstream.listing import OPEN_SCHEMA, record_from_tool

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

BIG_SCHEMA: dict[str, Any] = {"type": "object", "properties": {f"f{i:05d}": {"type": "string"} for i in range(2000)}}


def test_a_description_over_the_bound_is_cut_to_it_and_says_so() -> None:
    tool = mcp_types.Tool(name="huge_doc", description="word " * 1_000_000, input_schema={"type": "object"})
    rec = record_from_tool("up", tool, max_description_chars=1000)
    assert len(rec.description) == 1000
    assert rec.description.startswith("word word")
    assert "cut by toolatlas: 5000000 characters, max_description_chars is 1000" in rec.description
    assert rec.problems == ("description cut from 5000000 to 1000 characters (max_description_chars)",)


def test_a_schema_over_the_bound_becomes_an_open_object_schema() -> None:
    tool = mcp_types.Tool(name="huge_schema", description="fine", input_schema=BIG_SCHEMA, output_schema=BIG_SCHEMA)
    rec = record_from_tool("up", tool, max_schema_bytes=4096)
    assert rec.input_schema == OPEN_SCHEMA
    assert rec.output_schema is None
    problem = "; ".join(rec.problems)
    assert "inputSchema of" in problem and "over max_schema_bytes (4096)" in problem
    assert "outputSchema is over max_schema_bytes (4096); dropped" in problem
    assert rec.description == "fine"


def test_a_tool_within_the_default_bounds_is_kept_whole() -> None:
    tool = mcp_types.Tool(name="ok", description="d" * 8192, input_schema={"type": "object", "properties": {}})
    rec = record_from_tool("up", tool)
    assert rec.description == "d" * 8192
    assert rec.input_schema == {"type": "object", "properties": {}}
    assert rec.problems == ()
