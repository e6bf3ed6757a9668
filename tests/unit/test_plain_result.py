"""upstream/plain.py against the SDK's model round trip: the same dict, key order included,
wherever the hand-built path answers, for every protocol version."""

from __future__ import annotations

import itertools
import json

import pytest
from mcp_types import methods as _methods

from toolatlas.upstream import plain

SI = "io.modelcontextprotocol/serverInfo"
VERSIONS = sorted(v for (method, v) in _methods.SERVER_RESULTS if method == "tools/call")
MISSING = object()

CONTENT = [[], [{"type": "text", "text": "hi"}], [{"text": "a", "type": "text"}, {"type": "text", "text": ""}],
           [{"type": "text", "text": "x", "annotations": {"priority": 1}}], [{"type": "text", "text": "x", "_meta": {}}],
           [{"type": "image", "data": "AAAA", "mimeType": "image/png"}], [{"type": "text", "text": 5}], ["text"],
           [{"type": "text"}], "hi", None, MISSING]
IS_ERROR = [MISSING, None, True, False, 1, "true"]
RESULT_TYPE = [MISSING, "complete", "input_required", "later", 5, None]
STRUCTURED = [MISSING, None, {}, {"a": None, "b": [1, 2.5, {"c": None}], "ü": "ß"}, 5, "s", [1, None]]
META = [MISSING, None, {}, {SI: {"name": "up", "version": "1"}}, {SI: None}, {SI: {"v": None}, "x": 1}, {"x": None},
        {"x": {"y": 1}}, "str", []]
EXTRA = [MISSING, {"k": "v"}]


def _result(content: object, is_error: object, result_type: object, structured: object, meta: object,
            extra: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in (("structuredContent", structured), ("isError", is_error), ("_meta", meta),
                       ("content", content), ("resultType", result_type), ("extra", extra)):
        if value is not MISSING:
            out[key] = value
    return out


def _models(version: str, result: dict[str, object]) -> dict[str, object] | None:
    try:
        return _methods.serialize_server_result("tools/call", version, result)
    except Exception:  # noqa: BLE001 - refused by the models: the hand path must refuse it too
        return None


CASES = list(itertools.product(CONTENT, IS_ERROR, RESULT_TYPE, STRUCTURED, META, EXTRA))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_hand_path_builds_what_the_models_build(version: str) -> None:
    taken = 0
    for case in CASES:
        result = _result(*case)
        fast = plain.wire(version, json.loads(json.dumps(result)))
        if fast is None:
            continue
        taken += 1
        slow = _models(version, result)
        assert slow is not None, (version, result, fast)
        assert json.dumps(fast) == json.dumps(slow), (version, result)  # key order too: the bytes out
    assert taken > 100  # the hand path answers for a good share of these shapes


@pytest.mark.parametrize("version", VERSIONS)
def test_plain_results_take_the_hand_path(version: str) -> None:
    modern = version == "2026-07-28"
    plain_results = [
        {"content": [{"type": "text", "text": "Echo: hi"}], "isError": False},
        {"content": [{"type": "text", "text": "a"}], "structuredContent": {"result": "a"}, "isError": False},
        {"content": [], "isError": True},
    ]
    for result in plain_results:
        if modern:
            result = {**result, "resultType": "complete", "_meta": {SI: {"name": "t", "version": ""}}}
        fast = plain.wire(version, result)
        assert fast is not None, (version, result)
        assert json.dumps(fast) == json.dumps(_models(version, result))


def _nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_what_is_not_plain_goes_to_the_models() -> None:
    shallow = {"content": [], "resultType": "complete", "structuredContent": {"deep": _nested(20), "rows": [{}] * 100}}
    assert plain.wire("2026-07-28", shallow) is not None
    for version, result in [
        ("2026-07-28", {"content": [], "resultType": "input_required"}),
        ("2026-07-28", {"content": []}),  # resultType missing: the model refuses it
        ("2026-07-28", {"content": [], "resultType": "complete", "_meta": {"trace": 1}}),
        ("2025-11-25", {"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]}),
        ("2025-11-25", {"content": [], "structuredContent": [1]}),
        ("2025-11-25", {"content": [], "isError": 0}),
        ("2025-11-25", {"content": [], "more": 1}),
        ("1999-01-01", {"content": []}),
        ("2025-11-25", ["content"]),
        # the models' own depth limit and their cheaper walk of a large value
        ("2026-07-28", {"content": [], "resultType": "complete", "structuredContent": {"deep": _nested(40)}}),
        ("2025-11-25", {"content": [], "structuredContent": {"deep": _nested(300)}}),
        ("2025-11-25", {"content": [], "structuredContent": {"rows": [{"n": i} for i in range(300)]}}),
        ("2025-11-25", {"content": [], "_meta": {"deep": _nested(40)}}),
    ]:
        assert plain.wire(version, result) is None, (version, result)
