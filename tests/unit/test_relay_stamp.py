"""The raw relay's `_meta` on a tools/call request (upstream/relay.py `_stamped_meta`): what
the SDK session's own stamp puts there, for each protocol era, whatever the call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from mcp.client import session as sdk

from toolatlas.upstream.relay import _stamped_meta


def _stamps() -> list[Any]:
    info, caps = {"name": "toolatlas", "version": "1"}, {"elicitation": {}}
    return [
        sdk._make_modern_stamp("2026-07-28", info, caps, lambda name, args: {"Mcp-Param-Q": str(args.get("q"))}),
        sdk._make_modern_stamp("2026-07-28", info, caps, lambda name, args: {}, log_level="warning"),
        sdk._make_handshake_stamp("2025-11-25"),
        sdk._preconnect_stamp,
    ]


@pytest.mark.parametrize("stamp", _stamps())
def test_the_relay_puts_the_meta_the_sdk_stamp_puts_on_every_call(stamp: Any) -> None:
    session = SimpleNamespace(_stamp=stamp)
    for name, arguments in [("echo", {"message": "hi"}), ("search", {"q": "x"}), ("other", None)]:
        data: dict[str, Any] = {"method": "tools/call", "params": {"name": name, "arguments": arguments}}
        stamp(data, {})
        assert _stamped_meta(session) == data["params"].get("_meta"), (name, stamp)
    meta = _stamped_meta(session)
    if meta is not None:  # read once per stamp
        assert meta is _stamped_meta(session)
