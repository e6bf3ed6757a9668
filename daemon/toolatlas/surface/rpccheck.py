"""What is wrong with a client's JSON-RPC message, said so a model or a person can fix it.

Both client surfaces screen every message here before the SDK sees it: the Unix socket
(surface.wire, one line at a time) and the HTTP endpoint (surface.http, one POST body).
`screen(data)` returns the SDK's message, or a `Refusal`: the JSON-RPC error to answer with.

- -32700 parse error (id null): not JSON (invalid UTF-8, only whitespace); NaN/Infinity
  literals too, but with the message's id when it has one (it is JSON to Python's parser).
- -32600 invalid request: a response whose `error` is not an object with an integer
  `code` and a string `message` (id null: its id is the daemon's); a batch (a JSON array: answered with an array of this error, one
  for each request in it, as JSON-RPC answers a batch), not an object, an `id` that is not a
  string or an integer (then id null: it cannot be echoed), `jsonrpc` not "2.0", no
  string `method`, or nesting deeper than the SDK's parser takes (`MAX_DEPTH`; the id, when
  the message is too deep to decode at all, is read off its start as for an oversized line).
- -32602 invalid params: `params` not an object; a tools/call without a string `name`
  or with `arguments` that are not an object.

After the screen, the SDK answers a request it cannot take with a bare -32602 "Invalid
request parameters" and no data, both for params its models refuse and for a request sent
before `initialize`; `explain_params`, the server's middleware, says which (the field and
what it needs, or "send initialize first").

The SDK's parser would otherwise take a request with an object `id` for a notification (and
never answer it), accept NaN, and on deep nesting answer with pydantic's text or, on the
socket, fall into a recursion error that dropped the connection. A message that is fine
costs the one parse it always cost, plus two substring scans.
"""

from __future__ import annotations

import json
import re
from typing import Any

import mcp_types as types
import msgspec
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from toolatlas.jsonlines import (INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, MAX_DEPTH, PARSE_ERROR, Refusal,
                                 deeper_than, request_id_of)

__all__ = ["INTERNAL_ERROR", "INVALID_PARAMS", "INVALID_REQUEST", "PARSE_ERROR", "Refusal", "explain_params", "screen"]


_decode = msgspec.json.Decoder().decode
_BYTE_RE = re.compile(r"\(byte (\d+)\)")
TEXT = 200  # the most of the SDK's words on one field an error quotes
_NAN = "parse error: NaN and Infinity are not JSON numbers"



def screen(data: bytes) -> tuple[types.JSONRPCMessage | None, Refusal | None]:
    """(the message, None) when `data` is one the SDK may take, else (None, why not)."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(data, by_name=False)
    except ValueError:  # pydantic's ValidationError: not JSON, not a message, too deep
        return None, _refusal(data, parsed=False) or Refusal(
            INVALID_REQUEST, 'invalid request: not a JSON-RPC 2.0 message (an object with "jsonrpc": "2.0", '
            "a string `method` and an object `params`)")
    # pydantic takes NaN, and an invalid `id` for a notification's ignored extra field
    if (b"NaN" in data or b"Infinity" in data
            or isinstance(message, types.JSONRPCNotification) and b'"id"' in data):
        refused = _refusal(data, parsed=True)
        if refused is not None:
            return None, refused
    if isinstance(message, types.JSONRPCRequest) and message.method == "tools/call":
        refused = _call_params(message.params, message.id)
        if refused is not None:
            return None, refused
    return message, None


def _refusal(data: bytes, *, parsed: bool) -> Refusal | None:
    """Why the SDK's parser refused `data` (`parsed`: why it should have)."""
    obj, refused = _strict(data)
    if refused is not None:
        return refused
    refused = _shape(obj)
    if refused is not None or parsed:
        return refused
    if deeper_than(obj, MAX_DEPTH):
        return _too_deep(obj.get("id"))
    return None


def _too_deep(id_: Any) -> Refusal:
    return Refusal(INVALID_REQUEST, f"invalid request: the message nests arrays and objects more than {MAX_DEPTH} "
                   "levels deep; send flatter arguments", id_ if _valid_id(id_) else None)


def _strict(data: bytes) -> tuple[Any, Refusal | None]:
    """`data` decoded as strict JSON (no NaN or Infinity), or the parse error."""
    if not data.strip():
        return None, Refusal(PARSE_ERROR, "parse error: the message holds only whitespace; send one JSON-RPC 2.0 "
                             "object")
    try:
        return _decode(data), None
    except RecursionError:  # (it runs on the stack it is called on: well under 1000 levels)
        return None, _too_deep(request_id_of(data[:512]))
    except msgspec.ValidationError:  # a number beyond a double (1e400) is still JSON
        pass
    except msgspec.DecodeError as exc:
        if "surrogate" not in str(exc):
            message = _parse_message(data, str(exc))
            return None, Refusal(PARSE_ERROR, message, _constant_id(data) if message.startswith(_NAN) else None)
        obj, refused = _lenient(data)  # a lone "\ud800" escape is JSON, but no Unicode the SDK takes
        rid = obj.get("id") if isinstance(obj, dict) and _valid_id(obj.get("id")) else None
        return None, refused or Refusal(INVALID_REQUEST, "invalid request: a string holds a lone UTF-16 surrogate "
                                        "escape (\\ud800-\\udfff without its pair); send valid Unicode", rid)
    return _lenient(data)


def _lenient(data: bytes) -> tuple[Any, Refusal | None]:
    """Python's parser: numbers beyond a double (1e400) and lone surrogates, no NaN."""
    try:
        return json.loads(data, parse_constant=_no_constant), None
    except RecursionError:
        return None, _too_deep(request_id_of(data[:512]))
    except ValueError:
        return None, Refusal(PARSE_ERROR, "parse error: the message is not valid JSON")


def _constant_id(data: bytes) -> str | int | None:
    """The id of a message that is JSON but for NaN or Infinity (what Python's json.dumps
    writes for a float that is not finite): the client can match the error to its request,
    as the shim, whose parser takes them, does."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if _valid_id(rid) else None


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _parse_message(data: bytes, reason: str) -> str:
    if "UTF-8" in reason:
        return "parse error: the message is not valid UTF-8; JSON text must be UTF-8"
    m = _BYTE_RE.search(reason)
    at = int(m.group(1)) if m else -1
    if at >= 0 and (data.startswith((b"NaN", b"Infinity"), at) or data.startswith(b"-Infinity", max(at - 1, 0))):
        return f"{_NAN}; send a finite number, a string or null"
    reason = reason.removeprefix("JSON is malformed: ")
    return f"parse error: the message is not valid JSON ({reason}); send one JSON-RPC 2.0 object"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or isinstance(value, int) and not isinstance(value, bool)


def _shape(obj: Any) -> Refusal | None:
    """What makes the decoded `obj` no JSON-RPC 2.0 message, or None."""
    if isinstance(obj, list):  # each request of it gets the error under its own id (no waiting out a timeout)
        ids = tuple(m["id"] for m in obj if isinstance(m, dict) and "method" in m and _valid_id(m.get("id")))
        return Refusal(INVALID_REQUEST, "invalid request: batches (a JSON array of messages) are not supported; send "
                       "each JSON-RPC message on its own", batch=ids)
    if not isinstance(obj, dict):
        return Refusal(INVALID_REQUEST, f"invalid request: a JSON-RPC message is a JSON object, not {_kind(obj)}")
    if "id" in obj and not _valid_id(obj["id"]):
        hint = "; leave `id` out for a notification" if obj["id"] is None else ""
        return Refusal(INVALID_REQUEST, f"invalid request: `id` must be a string or an integer, not "
                       f"{_kind(obj['id'])}{hint}")
    rid = obj.get("id")
    if obj.get("jsonrpc") != "2.0":
        return Refusal(INVALID_REQUEST, 'invalid request: `jsonrpc` must be "2.0"', rid)
    if "method" not in obj:
        if "result" in obj:
            return None  # a response: the SDK matches it to its request
        if "error" in obj:
            error = obj["error"]
            if isinstance(error, dict) and type(error.get("code")) is int and isinstance(error.get("message"), str):
                return None
            # id null: a response's id is one of the daemon's requests, not the client's
            return Refusal(INVALID_REQUEST, f"invalid response to request {json.dumps(rid)[:40]}: `error` must be an "
                           "object with an integer `code` and a string `message`")
        return Refusal(INVALID_REQUEST, "invalid request: a message needs a `method` (a request or a notification) "
                       "or a `result` or `error` (a response)", rid)
    if not isinstance(obj["method"], str):
        return Refusal(INVALID_REQUEST, 'invalid request: `method` must be a string such as "tools/call"', rid)
    params = obj.get("params")
    if params is not None and not isinstance(params, dict):
        return Refusal(INVALID_PARAMS, f"invalid params: `params` must be an object, not {_kind(params)}", rid)
    return _call_params(params, rid) if obj["method"] == "tools/call" and "id" in obj else None


def _call_params(params: dict[str, Any] | None, rid: Any) -> Refusal | None:
    if params is None or not isinstance(params.get("name"), str):
        return Refusal(INVALID_PARAMS, "invalid params: tools/call needs `name`, a tool name string (tool_search, "
                       "execute_tool, catalog_status or a server__tool name)", rid)
    args = params.get("arguments")
    if args is not None and not isinstance(args, dict):
        return Refusal(INVALID_PARAMS, "invalid params: tools/call `arguments` must be an object of named arguments, "
                       f"not {_kind(args)}", rid)
    return None


_SDK_INVALID = "Invalid request parameters"  # the SDK's words for both (mcp.server.runner)


async def explain_params(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """The server's middleware: the SDK's bare "Invalid request parameters" said as what to
    send. A request before `initialize` is told to initialize first; params the SDK's models
    refuse name the field and what it must be."""
    try:
        return await call_next(ctx)
    except ValidationError as exc:
        if ctx.request_id is None:
            raise
        raise MCPError(INVALID_PARAMS, f"invalid params: {ctx.method} {_fields(exc)}") from exc
    except MCPError as exc:
        error = exc.error
        if (ctx.request_id is None or error.code != INVALID_PARAMS or error.message != _SDK_INVALID or error.data
                or ctx.session.client_params is not None):
            raise
        raise MCPError(INVALID_PARAMS, f"the session is not initialized: send `initialize` (then "
                       f"`notifications/initialized`) before {ctx.method}") from exc


def _fields(exc: ValidationError) -> str:
    """What the refused params lack or have wrong, by field (`params.clientInfo`), three at most."""
    errors = exc.errors()[:3]
    names = [".".join(str(part) for part in err["loc"]) or "params" for err in errors]
    missing = [f"`{n}`" for n, err in zip(names, errors) if err["type"] == "missing"]
    said = [f"needs {', '.join(missing)}"] if missing else []
    said += [f"`{n}`: {err['msg'][:TEXT]}" for n, err in zip(names, errors) if err["type"] != "missing"]
    more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
    return "; ".join(said) + more
