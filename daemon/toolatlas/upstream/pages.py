"""Large tools/list pages from a stdio upstream, parsed in slices so the event loop keeps serving.

The SDK parses a tools/list answer in three single pydantic calls (the JSON-RPC envelope, the
protocol revision's result model, `ListToolsResult`), each holding the GIL for the whole page:
one 20,000-tool page (3.5 MB) held every other client for 0.8-1.8 s, and no worker thread
helps while pydantic holds the GIL (issue #15 item 8). So the stdio transport, which sees the
raw line, takes an answer to a tools/list request it sent when the line is over
`BIG_PAGE_BYTES`:

1. msgspec splits the line into raw JSON spans without building objects (~16 ms for 3.5 MB);
2. each tool is validated as an `mcp_types.Tool` straight from its span, `SLICE` tools at a
   time, with a checkpoint between slices;
3. the tools are kept in `PAGES` under a token, and the SDK is handed the same answer with an
   empty `tools` list and the token in `_meta`, and a cache hint of 0 ms (the SDK's response
   cache must never serve the empty stand-in).

`listing.list_all_tools` takes the tools back by that token and lets the SDK session absorb
them slice by slice (its per-tool output-schema and x-mcp-header state), as a cache hit does.
Smaller pages, and answers that are not to a tools/list request, take the SDK's path unchanged.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from typing import Any

import anyio
import mcp_types
import msgspec
import pydantic

from toolatlas.jsonlines import is_request_id
from toolatlas.upstream.toolrepair import repaired

logger = logging.getLogger(__name__)

# An answer longer than this takes the sliced path (a 500-tool page of typical tools is ~150 kB).
BIG_PAGE_BYTES = 256 * 1024
# Tools validated between two checkpoints: ~2-4 ms of work on this machine's cores.
SLICE = 250
# The `_meta` key of the stand-in answer; its value is the token `PAGES.take` wants.
META_KEY = "dev.toolatlas/page"
# Pages parsed but not taken yet (a listing abandoned at its timeout leaves one behind).
MAX_KEPT = 8

_spans = msgspec.json.Decoder(dict[str, msgspec.Raw])
_list_spans = msgspec.json.Decoder(list[msgspec.Raw])
_plain = msgspec.json.Decoder()


class PageStash:
    """Parsed pages waiting for the listing that asked for them, by token; bounded."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self._pages: OrderedDict[str, list[mcp_types.Tool]] = OrderedDict()
        self._limit = limit
        self._tokens = itertools.count(1)

    def __len__(self) -> int:
        return len(self._pages)

    def put(self, tools: list[mcp_types.Tool]) -> str:
        token = f"p{next(self._tokens)}"
        self._pages[token] = tools
        while len(self._pages) > self._limit:
            self._pages.popitem(last=False)
        return token

    def take(self, meta: dict[str, Any] | None) -> list[mcp_types.Tool] | None:
        """The tools of the stand-in page whose `_meta` is `meta`, or None for an ordinary page."""
        token = (meta or {}).get(META_KEY)
        if not isinstance(token, str):
            return None
        tools = self._pages.pop(token, None)
        if tools is None:
            raise LookupError(f"tools/list page {token!r} is no longer held")
        return tools


PAGES = PageStash()


def _request_id(span: msgspec.Raw | None) -> int | str | None:
    if span is None:
        return None
    value = _plain.decode(span)
    return value if is_request_id(value) else None


async def parse_big_page(line: bytes, listing_ids: set[int | str],
                         server: str = "?") -> mcp_types.JSONRPCMessage | None:
    """The stand-in for `line` when it answers one of `listing_ids` (the id is removed from it),
    else None: the caller parses the line the ordinary way. A tool that is not a valid MCP
    Tool is repaired or dropped (toolrepair.py, `server` names the upstream in its log); one
    that stays invalid fails the request, as the SDK's own validation would."""
    if len(line) <= BIG_PAGE_BYTES or not listing_ids:
        return None
    try:
        envelope = _spans.decode(line)
        request_id = _request_id(envelope.get("id"))
        if request_id not in listing_ids or "result" not in envelope:
            return None
        result = _spans.decode(envelope["result"])
        spans = _list_spans.decode(result.pop("tools", msgspec.Raw(b"[]")))
        rest = {key: _plain.decode(value) for key, value in result.items()}
    except msgspec.DecodeError:
        return None  # not JSON of this shape: the ordinary path reports it
    assert request_id is not None
    listing_ids.discard(request_id)
    tools: list[mcp_types.Tool] = []
    try:
        for start in range(0, len(spans), SLICE):
            for span in spans[start:start + SLICE]:
                try:
                    tools.append(mcp_types.Tool.model_validate_json(bytes(span), by_name=False))
                except pydantic.ValidationError:
                    # as EofWatch does for a smaller page: repaired, or dropped; else it fails below
                    tools.extend(mcp_types.Tool.model_validate(t, by_name=False)
                                 for t in repaired(server, [_plain.decode(span)]))
            await anyio.sleep(0)  # a checkpoint: other clients' requests run between slices
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        what = (".".join(str(p) for p in errors[0]["loc"]) + ": " + errors[0]["msg"]) if errors else str(exc)
        message = f"invalid tools/list result: tool {len(tools)}: {what}"
        return mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                      error=mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=message))
    if "ttlMs" in rest:  # required on 2026-07-28; 0 = never cached, a hit would serve the empty stand-in
        rest["ttlMs"] = 0
    meta = rest.get("_meta")
    rest["_meta"] = {**(meta if isinstance(meta, dict) else {}), META_KEY: PAGES.put(tools)}
    rest["tools"] = []
    logger.debug("tools/list answer of %d bytes, %d tools: parsed in slices", len(line), len(tools))
    return mcp_types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=rest)


__all__ = ["BIG_PAGE_BYTES", "META_KEY", "PAGES", "PageStash", "SLICE", "parse_big_page"]
