"""Structured content against an upstream's outputSchema (catalog/validate.OutputValidator):
the SDK client's decisions and messages, without its hazards: no `$ref` is fetched, and a
catastrophic `pattern` is bounded and never runs on the event loop (the SDK's check ran `re`
there; tests/e2e/test_hostile_schemas.py shows the daemon frozen by it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from referencing import Registry

from tests.support.listener import RecordingListener

from toolatlas.catalog.validate import REGEX_BUDGET, OutputValidator

pytestmark = pytest.mark.hostile

EVIL = "^(a+)+$"
ARG = "a" * 34 + "!"  # the `re` engine needs minutes for this one
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
                          "required": ["n"]}


def _sdk_message(tool: str, schema: dict[str, Any], content: Any) -> str | None:
    """What mcp==2.3.0's `ClientSession.validate_tool_result` raises for this content."""
    validator = jsonschema.validators.validator_for(schema)(schema, registry=Registry())
    error = jsonschema.exceptions.best_match(validator.iter_errors(content))
    return None if error is None else f"Invalid structured content returned by tool {tool}: {error}"


@pytest.fixture
def listener() -> Iterator[RecordingListener]:
    lst = RecordingListener(b'{"type": "integer"}')  # fetched, it would reject the string below
    yield lst
    lst.close()


def test_conforming_content_passes_and_the_rest_gets_the_sdks_message() -> None:
    v = OutputValidator()
    assert v.check("t", SCHEMA, {"n": 1, "s": "x"}) is None
    assert v.accepts("t", SCHEMA, {"n": 1})  # compiled now: the loop's fast path
    for bad in ({"s": "x"}, {"n": "1"}, [1], None):
        want = _sdk_message("t", SCHEMA, bad)
        assert want is not None and v.check("t", SCHEMA, bad) == want
        assert not v.accepts("t", SCHEMA, bad)


def test_an_invalid_schema_fails_each_call_as_the_sdk_does() -> None:
    v = OutputValidator()
    got = v.check("t", {"type": "object", "properties": {"n": {"type": 5}}}, {"n": 1})
    assert got is not None and got.startswith("Invalid schema for tool t: 5 is not valid under any of the given schemas")


def test_a_local_ref_that_does_not_resolve_names_the_schema() -> None:
    got = OutputValidator().check("t", {"type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}, {"n": 1})
    assert got is not None and got.startswith("Invalid schema for tool t:")


def test_remote_and_file_refs_are_never_fetched(listener: RecordingListener, tmp_path: Any) -> None:
    target = tmp_path / "schema.json"
    target.write_text('{"type": "integer"}')
    v = OutputValidator()
    for ref in (f"{listener.url}/x", target.as_uri()):
        schema = {"type": "object", "properties": {"x": {"$ref": ref}, "n": {"type": "integer"}}, "required": ["n"]}
        assert v.check(ref, schema, {"x": "a string", "n": 1}) is None  # the rest is still checked:
        got = v.check(ref, schema, {"x": "a string"})
        assert got is not None and got.startswith(f"Invalid structured content returned by tool {ref}: 'n' is a required")
    assert listener.hits == []


@pytest.mark.timeout(20)
def test_a_catastrophic_pattern_is_bounded() -> None:
    v = OutputValidator()
    for schema in ({"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL}}},
                   {"type": "object", "patternProperties": {EVIL: {"type": "integer"}}, "additionalProperties": False}):
        got = v.check("t", schema, {"s": ARG} if "properties" in schema else {ARG: 1})
        assert got is not None, schema
        assert got.startswith("Invalid structured content returned by tool t:") or got == (
            "Structured content returned by tool t could not be checked: its outputSchema's pattern "
            f"{EVIL!r} did not finish within the {REGEX_BUDGET} s regex time limit")
    assert v.check("t", {"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL}}}, {"s": "aaa"}) is None


def test_a_changed_schema_is_compiled_again() -> None:
    v = OutputValidator()
    first = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert v.check("t", first, {"n": 1}) is None
    second = {"type": "object", "properties": {"n": {"type": "string"}}}  # a new listing: a new object
    assert v.check("t", second, {"n": 1}) == _sdk_message("t", second, {"n": 1})
    assert not v.accepts("t", first, {"n": 1})  # only the schema last compiled has a fast path


async def test_an_accepted_result_is_checked_on_the_loop_and_a_rejected_one_in_a_thread() -> None:
    # (that a hostile check leaves the loop free: test_validate_hostile.py, with the arguments')
    v = OutputValidator()
    assert await v.check_async("t", SCHEMA, {"n": 2}) is None  # compiled in a thread, the first time
    assert v.accepts("t", SCHEMA, {"n": 3})
    assert await v.check_async("t", SCHEMA, {"n": "x"}) == _sdk_message("t", SCHEMA, {"n": "x"})
