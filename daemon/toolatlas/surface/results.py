"""The shapes of a tools/call result the surface sends: a routed call's (the upstream's own,
or its sealed input_required), a meta-tool's JSON, an error a model can read. Shared by the
SDK handlers (server.py) and the raw relay (relay.py)."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import msgspec

from toolatlas.errors import ToolatlasError
from toolatlas.gateway.ports import CallOutcome

_encode = msgspec.json.Encoder().encode  # several times faster than json.dumps on a result


def call_result(outcome: CallOutcome) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
    """The SDK result for a routed call: the upstream's own result, passed through (a
    wire-form dict when the raw relay made the call: the turn of a parked exchange that a
    relayed call started), or its input_required with the gateway's sealed state."""
    if isinstance(outcome.payload, dict) and outcome.input_required is None:
        return dict(outcome.payload)
    if outcome.input_required is not None:
        return types.InputRequiredResult(
            input_requests=outcome.input_required.input_requests,  # type: ignore[arg-type]
            request_state=outcome.input_required.request_state,
        )
    if not isinstance(outcome.payload, types.CallToolResult):
        raise ToolatlasError(f"upstream returned {type(outcome.payload).__name__}, not a tool result")
    return outcome.payload


def json_result(obj: Any, *, is_error: bool = False) -> dict[str, Any]:
    """A meta-tool result: the JSON as text content and as structuredContent.

    A plain mapping in wire form, not a `CallToolResult`: the SDK validates and shapes a
    handler's result for the connection's protocol version either way, so building the model
    first only walks the result twice more (tool_search answers carry full input schemas)."""
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": _encode(obj).decode()}],
        "isError": is_error,
        "resultType": "complete",  # required on 2026-07-28; the SDK drops it for older versions
    }
    if isinstance(obj, dict):
        result["structuredContent"] = obj
    return result


def error_result(message: str) -> dict[str, Any]:
    """An isError result a model can read and act on (wire form, as `json_result`)."""
    return {"content": [{"type": "text", "text": message}], "isError": True, "resultType": "complete"}


__all__ = ["call_result", "error_result", "json_result"]
