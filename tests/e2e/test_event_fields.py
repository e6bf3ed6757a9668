"""The structured events a running daemon writes are exactly the documented ones
(`toolatlas.events.EVENT_FIELDS`, the README's table): names and fields, on real lines."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from tests.support.daemon import Daemon, stdio_testserver

from toolatlas.events import EVENT_FIELDS


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"event"' in line:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "event" in obj:
                out.append(obj)
    return out


def test_emitted_events_match_the_documented_fields(tmp_path: Path) -> None:
    d = Daemon(tmp_path, stdio_testserver("one"))
    with d:
        with d.client() as c:
            c.request("tools/list", {})
        assert d.search("echo a message back")
        assert d.tool("one__echo", {"message": "hi"})["content"][0]["text"] == "Echo: hi"
        assert d.tool("execute_tool", {"name": "one__no_such_tool"})["isError"]
        # A reload that adds an upstream, then one that is rejected (not valid TOML).
        text = d.config.read_text()
        d.config.write_text(text + "\n" + stdio_testserver("two"))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: any(e["event"] == "config_reloaded" for e in _events(d.log)), 30, "config_reloaded")
        d.wait_for(lambda: any(e["event"] == "catalog_changed" and e.get("server") == "two" for e in _events(d.log)),
                   60, "two listed")
        d.config.write_text(text + "\n[daemon\n")
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: any(e["event"] == "config_reload_rejected" for e in _events(d.log)), 30, "rejection")
    events = _events(d.log)
    seen = {e["event"] for e in events}
    # (tool_search_fallback needs a failed embedder; its fields are checked wherever it appears)
    assert {"tools_list_served", "tool_search_completed", "execute_tool_completed",
            "execute_tool_failed", "upstream_state_changed", "catalog_changed", "config_reloaded",
            "config_reload_rejected"} <= seen, seen
    for e in events:
        assert e["event"] in EVENT_FIELDS, e
        assert e["environment"] == "default", e  # the envelope names the daemon's [daemon] environment
        fields = set(e) - {"ts", "event", "environment"}
        # log_queries is off: the query field is dropped, every other documented field is there
        assert fields == EVENT_FIELDS[e["event"]] - {"query"}, e
    failed = next(e for e in events if e["event"] == "execute_tool_failed")
    assert failed["name"] == "one__no_such_tool" and failed["outcome"] == "bad_input"
    assert "unknown tool" in failed["message"] and failed["error_class"] == "BadInput"
    done = next(e for e in events if e["event"] == "execute_tool_completed")
    assert done["name"] == "one__echo" and done["upstream"] == "one" and done["outcome"] == "ok"
