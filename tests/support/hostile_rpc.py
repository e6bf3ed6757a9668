"""Malformed JSON-RPC a hostile client sends (issue #15 item 12), with the answer each must get.

One table for both surfaces: tests/e2e/test_fuzz.py sends every case as a line on the Unix
socket, tests/e2e/test_http_endpoint.py as the body of a POST. A case is answered either by
a JSON-RPC error with `code` and `id`, or (code None) by a result for `id`, a tool result
whose text holds `text` when that is set.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    code: int | None  # the JSON-RPC error code; None: a result
    id: Any = None  # the id the answer carries
    text: str = ""  # a phrase of the error message, or (code None) of the tool result's text

    def __str__(self) -> str:
        return self.name


def tool_call(id_: Any, name: str, arguments: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}}).encode()


def _ping(id_text: str) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + id_text.encode() + b',"method":"ping"}'


DEEP = 990  # levels of nesting in a line of about 2 KB
DEEP_ARGS = (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"execute_tool","arguments":'
             b'{"name":"alpha__echo","arguments":{"message":' + b"[" * DEEP + b"]" * DEEP + b"}}}}")

CASES = [
    Case("whitespace only", b" \t  ", PARSE_ERROR, text="whitespace"),
    Case("not json", b"{nope", PARSE_ERROR),
    Case("invalid utf-8", b'{"jsonrpc":"2.0","id":18,"method":"ping","params":{"x":"\xff\xfe"}}', PARSE_ERROR, text="UTF-8"),
    Case("NaN literal", b'{"jsonrpc":"2.0","id":10,"method":"ping","params":{"x":NaN}}', PARSE_ERROR, 10, text="NaN"),
    Case("Infinity top_k", b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"tool_search",'
         b'"arguments":{"query":"echo","top_k":-Infinity}}}', PARSE_ERROR, 9, text="Infinity"),
    Case("deep nesting", b"[" * DEEP + b"]" * DEEP, INVALID_REQUEST, text="levels"),
    Case("deep arguments", DEEP_ARGS, INVALID_REQUEST, 5, "levels"),
    Case("batch of notifications", b'[{"jsonrpc":"2.0","method":"notifications/initialized"}]', INVALID_REQUEST,
         text="batch"),
    Case("empty batch", b"[]", INVALID_REQUEST, text="batch"),
    Case("scalar", b"5", INVALID_REQUEST, text="JSON object"),
    Case("id object", _ping('{"a":1}'), INVALID_REQUEST, text="`id`"),
    Case("id array", _ping("[1]"), INVALID_REQUEST, text="`id`"),
    Case("id float", _ping("1.5"), INVALID_REQUEST, text="`id`"),
    Case("id bool", _ping("true"), INVALID_REQUEST, text="`id`"),
    Case("id null", _ping("null"), INVALID_REQUEST, text="`id`"),
    Case("id 1e400", _ping("1e400"), INVALID_REQUEST, text="`id`"),
    Case("id huge", _ping(str(10**38)), None, 10**38),
    Case("no jsonrpc", b'{"id":25,"method":"ping"}', INVALID_REQUEST, 25, '"2.0"'),
    Case("method not a string", b'{"jsonrpc":"2.0","id":27,"method":5}', INVALID_REQUEST, 27, "`method`"),
    Case("params array", b'{"jsonrpc":"2.0","id":11,"method":"tools/list","params":[1]}', INVALID_PARAMS, 11, "`params`"),
    Case("params string", b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":"x"}', INVALID_PARAMS, 12, "`params`"),
    Case("arguments array", tool_call(13, "tool_search", [1]), INVALID_PARAMS, 13, "`arguments`"),
    Case("arguments string", tool_call(14, "execute_tool", "x"), INVALID_PARAMS, 14, "`arguments`"),
    Case("tool name not a string", b'{"jsonrpc":"2.0","id":28,"method":"tools/call","params":{"name":7}}',
         INVALID_PARAMS, 28, "`name`"),
    Case("lone surrogate", tool_call(29, "\ud800", {}), INVALID_REQUEST, 29, "surrogate"),
    Case("response error a string", b'{"jsonrpc":"2.0","id":31,"error":"bad"}', INVALID_REQUEST,
         text="invalid response to request 31: `error` must be an object"),
    Case("response error code a string", b'{"jsonrpc":"2.0","id":32,"error":{"code":"x","message":"m"}}',
         INVALID_REQUEST, text="invalid response to request 32"),
    Case("unknown method", b'{"jsonrpc":"2.0","id":16,"method":"no/such"}', METHOD_NOT_FOUND, 16, "no/such"),
    Case("top_k 1e400", b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"tool_search",'
         b'"arguments":{"query":"echo","top_k":1e400}}}', None, 8, "top_k must be an integer from 1 to 20"),
    Case("top_k string", tool_call(19, "tool_search", {"query": "echo", "top_k": "3"}), None, 19,
         "top_k must be an integer from 1 to 20"),
    Case("top_k float", tool_call(21, "tool_search", {"query": "echo", "top_k": 2.5}), None, 21,
         "top_k must be an integer from 1 to 20"),
    Case("top_k negative", tool_call(20, "tool_search", {"query": "echo", "top_k": -3}), None, 20, '"matches"'),
]

# What a client-facing message must never hold: a traceback, an exception class, pydantic's text.
_LEAKS = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception)\b|validation error|pydantic|union\[|\bdict_type\b")


# A batch with requests: its answer is an array of the error, one for each request's id.
BATCH = b"[" + _ping("17") + b',{"jsonrpc":"2.0","method":"notifications/initialized"},' + _ping('"b"') + b"]"
BATCH_IDS = [17, "b"]


def check_batch_answer(reply: Any) -> None:
    assert isinstance(reply, list) and [r.get("id") for r in reply] == BATCH_IDS, reply
    for r in reply:
        check_answer(Case("batch", b"", INVALID_REQUEST, r["id"], "batch"), r)


def check_answer(case: Case, reply: dict[str, Any]) -> None:
    """`reply` (one decoded JSON-RPC message) is the answer `case` must get."""
    assert reply.get("jsonrpc") == "2.0" and reply.get("id") == case.id, (case.name, reply)
    if case.code is not None:
        error = reply.get("error")
        assert isinstance(error, dict) and error.get("code") == case.code, (case.name, reply)
        message = error.get("message")
        # the SDK's -32601 names the method in `data`
        assert isinstance(message, str) and case.text in message + str(error.get("data", "")), (case.name, reply)
        assert not _LEAKS.search(message), (case.name, message)
        return
    assert "result" in reply, (case.name, reply)
    if case.text:
        text = "".join(c.get("text", "") for c in reply["result"].get("content", []))
        assert case.text in text, (case.name, reply)
        assert not _LEAKS.search(text), (case.name, text)
