"""catalog.catalog_file: the one catalog JSONL reader (eval, cards, rift, bench)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolatlas.catalog.catalog_file import CatalogFileError, load_records, read_catalog
from toolatlas.errors import BadInput


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_lines_are_normalised_once_for_every_reader(tmp_path: Path) -> None:
    cat = _write(tmp_path / "c.jsonl", [
        json.dumps({"server": "s", "name": "a", "description": "first", "input_schema": {"type": "object", "properties": {}}, "id": 7}),
        "",
        json.dumps({"server": "s", "name": "b", "description": None, "input_schema": ["not", "an", "object"]}),
        json.dumps({"server": "s", "name": "a", "description": "second copy"}),
        json.dumps({"server": 3, "name": "c"}),
    ])
    lines = read_catalog(cat)
    assert [(x.lineno, x.server, x.name, x.description) for x in lines] == [
        (1, "s", "a", "first"), (3, "s", "b", ""), (5, "3", "c", "")]
    assert lines[1].input_schema == {"type": "object"}
    assert lines[0].raw["id"] == 7  # extra keys are kept for tools that rewrite lines
    recs = load_records(cat)
    assert list(recs) == ["s", "3"]
    assert [r.name for r in recs["s"]] == ["s__a", "s__b"]


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", "c.jsonl:2: not valid JSON"),
    ("[1, 2]", "c.jsonl:2: expected a JSON object"),
    ('{"server": "s"}', "c.jsonl:2: a catalog line needs 'server' and 'name'"),
    # deeper than the JSON decoder's recursion limit: RecursionError, a traceback in eval/rift/cards
    ('{"server": "s", "name": "b", "input_schema": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "c.jsonl:2: not valid JSON: nested too deeply"),
])
def test_a_bad_line_is_named(tmp_path: Path, line: str, says: str) -> None:
    cat = _write(tmp_path / "c.jsonl", [json.dumps({"server": "s", "name": "a"}), line])
    with pytest.raises(CatalogFileError, match=says) as info:
        read_catalog(cat)
    assert isinstance(info.value, BadInput)


def test_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(CatalogFileError, match="cannot read"):
        read_catalog(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_a_file_with_no_tool_is_bad_input(tmp_path: Path, text: str) -> None:
    """Every reader is a command on a file someone named (eval, rift, cards): an empty one
    must not pass a Rift gate or give an evaluation of zeros."""
    cat = tmp_path / "empty.jsonl"
    cat.write_text(text)
    with pytest.raises(CatalogFileError, match="empty.jsonl: holds no tools"):
        read_catalog(cat)
