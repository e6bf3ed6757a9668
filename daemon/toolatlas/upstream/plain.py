"""A plain tools/call result's wire form, without the model round trip.

`mcp_types.methods.serialize_server_result` validates a result into the protocol version's
pydantic model and dumps it again: on a relayed call that is the largest single cost after
the two process hops (tens of microseconds with cold caches, more than the rest of the
reply's handling). Most results are plain: text blocks, maybe structured content, isError,
resultType, a `serverInfo` stamp. For exactly those, `wire` builds the same dict the model
round trip builds (same keys, same order, the same values: nothing in them is coerced) by
hand; anything else gives None and goes through the models as before.
tests/unit/test_plain_result.py holds the two to the same output, shape by shape and for
every protocol version.
"""

from __future__ import annotations

import typing
from typing import Any

import mcp_types
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolatlas.jsonlines import deeper_than

_SERVER_INFO = mcp_types.SERVER_INFO_META_KEY
_KEYS = frozenset({"_meta", "content", "isError", "resultType", "structuredContent"})
_TEXT_KEYS = frozenset({"type", "text"})
# The versions taken here: those whose tools/call result model (the SDK's own table; on
# 2026-07-28 the CallToolResult of its union with InputRequiredResult) has exactly the fields
# `wire` writes, in this order. An SDK that changes a model turns this off for its versions.
_FIELDS_LEGACY = ["_meta", "content", "isError", "structuredContent"]
_FIELDS_MODERN = ["_meta", "content", "isError", "resultType", "structuredContent"]


def _fields(model: object) -> list[str] | None:
    members = typing.get_args(model) or (model,)
    calls = [m for m in members if getattr(m, "__name__", "") == "CallToolResult"]
    if len(calls) != 1:
        return None
    fields = getattr(calls[0], "model_fields", {})
    return [f.alias or name for name, f in fields.items()]


def _versions(modern: bool) -> frozenset[str]:
    want = _FIELDS_MODERN if modern else _FIELDS_LEGACY
    return frozenset(v for (method, v), model in _methods.SERVER_RESULTS.items()
                     if method == "tools/call" and (v in MODERN_PROTOCOL_VERSIONS) is modern and _fields(model) == want)


_LEGACY = _versions(modern=False)
_MODERN = _versions(modern=True)


# Structured content and `_meta` are taken as they are only when small and shallow: the
# models' serializer has a depth limit of its own (the relay turns its error into the
# "nests deeper than the SDK reads" answer), and on a large value its Rust walk is the
# cheaper one.
_MAX_NESTING = 32
_MAX_CONTAINERS = 256


def _small(value: object) -> bool:
    """Whether decoded JSON `value` holds at most _MAX_CONTAINERS arrays and objects, nested
    at most _MAX_NESTING deep."""
    return not deeper_than(value, _MAX_NESTING, containers=_MAX_CONTAINERS)


def wire(version: str, result: object) -> dict[str, Any] | None:
    """`serialize_server_result("tools/call", version, result)` for a plain result, or None
    when `result` is not plain (the caller runs the models)."""
    if not isinstance(result, dict) or not result.keys() <= _KEYS:
        return None
    modern = version in _MODERN
    if not modern and version not in _LEGACY:
        return None
    content = result.get("content")
    if not isinstance(content, list):
        return None
    blocks = []
    for block in content:
        if type(block) is not dict or block.keys() != _TEXT_KEYS or block["type"] != "text" \
                or type(block["text"]) is not str:
            return None
        blocks.append({"text": block["text"], "type": "text"})
    out: dict[str, Any] = {}
    meta = result.get("_meta")
    if meta is not None:
        if type(meta) is not dict or not _small(meta):
            return None
        if modern:  # ResultMetaObject: its one field, None left out
            if not meta.keys() <= {_SERVER_INFO}:
                return None
            meta = {_SERVER_INFO: meta[_SERVER_INFO]} if meta.get(_SERVER_INFO) is not None else {}
        out["_meta"] = meta
    out["content"] = blocks
    is_error = result.get("isError")
    if is_error is not None:
        if type(is_error) is not bool:
            return None
        out["isError"] = is_error
    if modern:
        if result.get("resultType") != "complete":
            return None  # missing (the model requires it), input_required, or a later type
        out["resultType"] = "complete"
    structured = result.get("structuredContent")
    if structured is not None:
        if not modern and (type(structured) is not dict or not all(type(k) is str for k in structured)):
            return None
        if (type(structured) is dict or type(structured) is list) and not _small(structured):
            return None
        out["structuredContent"] = structured
    return out


__all__ = ["wire"]
