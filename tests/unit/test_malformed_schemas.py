"""One malformed tool schema never takes its upstream's catalog out of the index (#15 item 7):
an `enum` that is not a list is left out of the tool's document; the tool is still found."""

from __future__ import annotations

import pytest

from toolatlas.retrieval.engine import Engine, ToolDoc

MALFORMED = [
    {"type": "object", "properties": {"x": {"enum": 5}}},
    {"type": "object", "properties": {"x": {"enum": {"a": 1}}}},
    {"type": "object", "properties": {"x": {"type": "array", "items": {"enum": True}}}},
]


@pytest.mark.parametrize("schema", MALFORMED)
def test_malformed_enum_is_indexed_without_it(schema: dict) -> None:  # type: ignore[type-arg]
    engine = Engine(state_dir=None, mode="bm25", embedder="none")
    engine.load()
    good = ToolDoc(name="a__read_file", server="a", tool="read_file", description="Read a file from disk.",
                   input_schema={"type": "object", "properties": {"path": {"type": "string"}}})
    bad = ToolDoc(name="a__pick_color", server="a", tool="pick_color", description="Pick a color for the theme.",
                  input_schema=schema)
    engine.update([good, bad], [])
    assert [h.name for h in engine.search("pick a color", 1).hits] == ["a__pick_color"]
    assert [h.name for h in engine.search("read a file", 1).hits] == ["a__read_file"]
