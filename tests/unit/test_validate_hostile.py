"""Hostile inputSchemas (issue #15 items 2 and 3): the validator never fetches a remote
`$ref` or reads a `file://` one, survives `$ref` cycles, and a catastrophic `pattern` is
bounded (never blocks the event loop). Each test failed on the old validator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.listener import RecordingListener

from toolatlas.catalog.model import ToolRecord
from toolatlas.catalog.validate import ArgumentValidator, OutputValidator

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile


def _rec(schema: dict[str, Any], tool: str = "t") -> ToolRecord:
    return ToolRecord.make("hostile", tool, "a tool", schema)


@pytest.fixture
def listener() -> Iterator[RecordingListener]:
    # it would answer a schema that rejects strings: a passing string proves it was not fetched
    lst = RecordingListener(b'{"type": "integer"}')
    yield lst
    lst.close()


def test_remote_ref_is_never_fetched_and_the_rest_is_still_checked(listener: RecordingListener) -> None:
    v = ArgumentValidator()
    rec = _rec({"type": "object", "properties": {"x": {"$ref": f"{listener.url}/x"}, "n": {"type": "integer"}},
                "required": ["n"]})
    # The fetched schema would say "integer": a string passes only because it is never fetched.
    assert v.check(rec, {"x": "a string", "n": 1}) == []
    assert v.check(rec, {"x": "a string"})  # `required` still enforced
    assert listener.hits == []


def test_remote_ref_at_the_root_and_base_id_are_never_fetched(listener: RecordingListener) -> None:
    v = ArgumentValidator()
    assert v.check(_rec({"$ref": f"{listener.url}/root"}), {"a": 1}) == []
    based = _rec({"$id": f"{listener.url}/base/", "type": "object",
                  "properties": {"y": {"$ref": "other.json"}}}, tool="based")
    assert v.check(based, {"y": "s"}) == []
    assert listener.hits == []


def test_file_ref_is_never_read(tmp_path: Path) -> None:
    target = tmp_path / "schema.json"
    target.write_text('{"type": "integer"}')  # read, it would reject the string below
    v = ArgumentValidator()
    rec = _rec({"type": "object", "properties": {"x": {"$ref": target.as_uri()}}})
    assert v.check(rec, {"x": "not an integer"}) == []


def test_local_refs_still_work() -> None:
    v = ArgumentValidator()
    rec = _rec({"type": "object", "$defs": {"n": {"type": "integer"}},
                "definitions": {"s": {"type": "string"}},
                "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/definitions/s"}}})
    assert v.check(rec, {"a": 1, "b": "x"}) == []
    problems = v.check(rec, {"a": "x", "b": 2})
    assert len(problems) == 2 and "/a" in problems[0].shown and "/b" in problems[1].shown


def test_a_problem_shows_the_caller_its_value_and_logs_only_the_schema_s_words() -> None:
    v = ArgumentValidator()
    rec = _rec({"type": "object", "required": ["token"], "additionalProperties": False,
                "properties": {"token": {"type": "string", "minLength": 12}, "n": {"type": "integer"}}})
    problems = v.check(rec, {"token": "hunter2", "n": "s3cr3t", "hunter3": 1})
    shown, logged = " ".join(p.shown for p in problems), " ".join(p.logged for p in problems)
    assert "'hunter2' is too short" in shown and "'s3cr3t'" in shown and "hunter3" in shown
    assert "at /token: fails minLength (12)" in logged and "at /n: fails type ('integer')" in logged
    assert "at the top level: fails additionalProperties" in logged
    assert not any(secret in logged for secret in ("hunter2", "s3cr3t", "hunter3")), logged


def test_a_problem_quotes_at_most_300_characters_of_the_callers_value() -> None:
    """jsonschema's words quote the value whole: a 1 MB string for an integer came back as a
    1 MB error, ten such arguments as 10 MB."""
    v = ArgumentValidator()
    rec = _rec({"type": "object", "properties": {f"n{i}": {"type": "integer"} for i in range(10)}})
    problems = v.check(rec, {f"n{i}": "x" * 1_000_000 for i in range(10)})
    assert len(problems) == 10 and all(len(p.shown) < 330 for p in problems), [len(p.shown) for p in problems]
    assert problems[0].shown.startswith("at /n0: 'xxx") and problems[0].shown.endswith("...")
    short = v.check(rec, {"n1": "abc"})
    assert [p.shown for p in short] == ["at /n1: 'abc' is not of type 'integer'"]


def test_ref_cycles_are_handled() -> None:
    v = ArgumentValidator()
    tight = _rec({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, tool="tight")
    assert v.check(tight, {"q": 1}) == []
    mutual = _rec({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
                   "$ref": "#/$defs/a"}, tool="mutual")
    assert v.check(mutual, {"q": 1}) == []
    # A recursive schema that does consume the argument is a real, enforced schema.
    tree = _rec({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                    "kids": {"type": "array",
                                                                             "items": {"$ref": "#/$defs/node"}}}}},
                 "$ref": "#/$defs/node"}, tool="tree")
    assert v.check(tree, {"v": 1, "kids": [{"v": 2, "kids": []}]}) == []
    assert v.check(tree, {"v": 1, "kids": [{"v": "x"}]})


EVIL = "^(a+)+$"
ARG = "a" * 34 + "!"  # the `re` engine needs minutes for this one


@pytest.mark.timeout(20)
def test_catastrophic_pattern_is_bounded() -> None:
    v = ArgumentValidator()
    rec = _rec({"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL}}})
    problems = v.check(rec, {"s": ARG})  # old code: minutes of backtracking here
    assert problems and "/s" in problems[0].shown
    assert v.check(rec, {"s": "aaaa"}) == []


@pytest.mark.timeout(20)
def test_catastrophic_pattern_properties_are_bounded() -> None:
    v = ArgumentValidator()
    rec = _rec({"type": "object", "patternProperties": {EVIL: {"type": "integer"}},
                "additionalProperties": False})
    assert v.check(rec, {ARG: 1})  # an additional property: rejected, quickly
    assert v.check(rec, {"aaa": 1}) == []
    assert v.check(rec, {"aaa": "x"})


@pytest.mark.parametrize("checked", ["arguments", "output"])
async def test_check_async_leaves_the_event_loop_free(checked: str) -> None:
    """While a hostile check runs, the loop keeps ticking (old code: no async check at all;
    an outputSchema's: the SDK's check on the loop), of arguments or of a tool's result."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"},
                                              "t": {"type": "string", "pattern": EVIL}}}
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        instance = {"s": "a" * 40 + "!", "t": ARG}
        if checked == "arguments":
            problems: Any = await ArgumentValidator().check_async(_rec(schema), instance)
        else:
            problems = await OutputValidator().check_async("t", schema, instance)
        tg.cancel_scope.cancel()
    assert problems
    assert ticks >= 1
