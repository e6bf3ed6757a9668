"""One malformed tool schema never takes its upstream's catalog out of the index (#15 item 7):
an `enum` that is not a list is left out of the tool's document; the tool is still found."""

from __future__ import annotations

import pytest

from toolatlas.retrieval.engine import Engine, ToolDoc

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

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


def test_repair_removes_only_what_the_meta_schema_rejects() -> None:
    from toolatlas.catalog.schemas import repair_schema

    good = {"type": "object", "properties": {"path": {"type": "string", "enum": ["a", "b"]}}, "required": ["path"]}
    assert repair_schema(good) == (good, ())
    assert repair_schema(good)[0] is good  # no copy on the common path
    fixed, problems = repair_schema({"type": "object", "properties": {"x": {"enum": 5, "type": "string"}},
                                     "required": ["x", 7]})
    assert fixed == {"type": "object", "properties": {"x": {"type": "string"}}}
    assert problems == ("removed properties/x/enum: 5 is not of type 'array'",
                        "removed required: 7 is not of type 'string'")
    assert repair_schema("not a schema")[0] == {"type": "object"}  # type: ignore[arg-type]


def test_record_carries_its_repairs_and_hashes_the_repaired_schema() -> None:
    from toolatlas.catalog.model import ToolRecord, schema_hash

    rec = ToolRecord.make("a", "pick", "Pick one.", {"type": "object", "properties": {"x": {"enum": {"k": 1}}}})
    assert rec.input_schema == {"type": "object", "properties": {"x": {}}}
    assert rec.problems and rec.problems[0].startswith("removed properties/x/enum")
    assert rec.content_hash == schema_hash("pick", "Pick one.", rec.input_schema)
    assert ToolRecord.make("a", "ok", "", {"type": "object"}).problems == ()
