"""Structured events: one JSON object a line, queries dropped unless configured, secrets redacted."""

from __future__ import annotations

import enum
import io
import json
import re
import threading
from datetime import datetime
from pathlib import Path

import pytest

from toolatlas.events import (
    AUDIT_EVENTS,
    AUDIT_FIELDS,
    EVENT_FIELDS,
    EVENT_NAMES,
    EXECUTE_TOOL_FAILED,
    TOOL_SEARCH_COMPLETED,
    UPSTREAM_STATE_CHANGED,
    Events,
)

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _lines(buf: io.StringIO) -> list[dict]:
    text = buf.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_one_json_object_per_line_with_envelope() -> None:
    buf = io.StringIO()
    ev = Events(buf)
    ev.emit(TOOL_SEARCH_COMPLETED, results=5, matched_servers=["files", "git"], latency_ms=3.2,
            top_k=5, scope=["files", "git"], mode="hybrid", cache="miss")
    ev.emit("catalog_changed", upstream="files", added=2, removed=0, changed=1, index_version=4)
    first, second = _lines(buf)
    assert list(first)[:2] == ["ts", "event"]
    assert RFC3339_UTC.match(first["ts"])
    datetime.fromisoformat(first["ts"].replace("Z", "+00:00"))
    assert first["event"] == "tool_search_completed"
    assert first["results"] == 5 and first["matched_servers"] == ["files", "git"]
    assert first["cache"] == "miss" and first["mode"] == "hybrid"
    assert second["event"] == "catalog_changed" and second["index_version"] == 4


def test_query_is_dropped_unless_configured() -> None:
    buf = io.StringIO()
    Events(buf).emit(TOOL_SEARCH_COMPLETED, query="email my divorce lawyer", results=1,
                     detail={"query": "nested copy", "k": 1})
    (line,) = _lines(buf)
    assert "query" not in line and line["detail"] == {"k": 1}
    assert "divorce" not in buf.getvalue() and "nested copy" not in buf.getvalue()

    buf = io.StringIO()
    Events(buf, log_queries=True).emit(TOOL_SEARCH_COMPLETED, query="read a file", results=1)
    assert _lines(buf)[0]["query"] == "read a file"


def test_secrets_are_redacted_everywhere() -> None:
    token = "ghp_S3cr3tT0ken\"quoted"
    buf = io.StringIO()
    ev = Events(buf, secrets=[token, "hunter2", ""])
    ev.emit(EXECUTE_TOOL_FAILED, name="git__push", upstream="git", error_class="UpstreamProtocolError",
            message=f"401 for Authorization: Bearer {token}",
            headers={"Authorization": f"Bearer {token}", f"x-{token}": 1},
            args=["--password", "hunter2"], exc=RuntimeError("login hunter2 refused"))
    raw = buf.getvalue()
    assert "S3cr3t" not in raw and "hunter2" not in raw and "T0ken" not in raw
    (line,) = _lines(buf)
    assert line["message"] == "401 for Authorization: Bearer [REDACTED]"
    assert line["headers"]["Authorization"] == "Bearer [REDACTED]"
    assert "x-[REDACTED]" in line["headers"]
    assert line["args"] == ["--password", "[REDACTED]"]
    assert line["exc"] == "RuntimeError: login [REDACTED] refused"
    assert line["error_class"] == "UpstreamProtocolError"

    ev.add_secrets(["newkey123"])
    ev.emit("catalog_changed", note="rotated to newkey123")
    assert _lines(buf)[1]["note"] == "rotated to [REDACTED]"


def test_flat_events_are_redacted_as_field_by_field_cleaning_would() -> None:
    """A record of scalars and string lists is encoded once and searched once for secrets;
    what it writes must equal the value-by-value cleaning, secrets with JSON-escaped
    characters included (their escaped form is not what the secret looks like)."""
    quoted, plain = 'ab"cd\\ef', "s3cr3t-t0ken"
    buf = io.StringIO()
    ev = Events(buf, secrets=[quoted, plain], log_queries=True)
    records = [
        {"query": f"use {quoted} now", "results": 3},
        {"message": f"x{plain}y", "tags": ["a", plain], "n": 1.5},
        {"message": "nothing secret here", "tags": ("a", "b"), "ok": True, "none": None, "n": 2},
        {"message": "true", "flag": True},  # JSON syntax only, no secret
    ]
    for fields in records:
        ev.emit("catalog_changed", **fields)
    lines = _lines(buf)
    raw = buf.getvalue()
    assert "cd\\\\ef" not in raw and plain not in raw
    assert lines[0]["query"] == "use [REDACTED] now"
    assert lines[1]["message"] == "x[REDACTED]y" and lines[1]["tags"] == ["a", "[REDACTED]"]
    for fields, line in zip(records, lines):
        expected = ev._clean({"ts": line["ts"], "event": "catalog_changed", **fields})
        assert line == json.loads(json.dumps(expected))

    # a secret that is also JSON syntax: the line's `true` is not a string, left alone
    buf2 = io.StringIO()
    Events(buf2, secrets=["true"]).emit("catalog_changed", flag=True, message="true story")
    (line,) = _lines(buf2)
    assert line["flag"] is True and line["message"] == "[REDACTED] story"


def test_bare_credential_of_a_header_value_is_redacted() -> None:
    buf = io.StringIO()
    ev = Events(buf, secrets=["Bearer tok_0123456789", "Basic ab"])
    ev.emit("execute_tool_failed", message="upstream rejected tok_0123456789", hdr="Bearer tok_0123456789",
            note="Basic ab ab")
    line = _lines(buf)[0]
    assert line["message"] == "upstream rejected [REDACTED]"
    assert line["hdr"] == "[REDACTED]"
    # Too short to redact alone without mangling ordinary text; the whole value still goes.
    assert line["note"] == "[REDACTED] ab"


def test_with_secrets_from_a_config() -> None:
    from toolatlas.config import parse, secrets

    cfg = parse(
        '[[upstream]]\nname = "gh"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n'
        'headers = { Authorization = "Bearer ghp_abcdefghij" }\n'
    )
    buf = io.StringIO()
    Events(buf, secrets=secrets(cfg)).emit("upstream_state_changed", upstream="gh",
                                          reason="401: token ghp_abcdefghij expired")
    assert _lines(buf)[0]["reason"] == "401: token [REDACTED] expired"


def test_values_become_json_and_envelope_cannot_be_overridden() -> None:
    class State(enum.Enum):
        READY = "ready"

    buf = io.StringIO()
    Events(buf).emit(UPSTREAM_STATE_CHANGED, upstream="files", old=State.READY, new="degraded",
                     ts="forged", ratio=float("nan"), obj=object.__new__(object), tags=("a", "b"))
    (line,) = _lines(buf)
    assert line["ts"] != "forged" and line["field_ts"] == "forged"
    assert line["old"] == "ready" and line["ratio"] == "nan" and line["tags"] == ["a", "b"]
    assert line["obj"].startswith("<object object")


def test_the_envelope_names_the_environment() -> None:
    """issue 18: every line says which daemon wrote it; a field cannot forge it."""
    buf = io.StringIO()
    events = Events(buf)
    events.emit("config_reload_rejected", reason="x")
    events.environment = "staging"
    events.emit("config_reload_rejected", reason="y", environment="forged")
    first, second = _lines(buf)
    assert "environment" not in first
    assert list(second)[:3] == ["ts", "event", "environment"] and second["environment"] == "staging"
    assert second["field_environment"] == "forged"


def test_default_stream_is_stderr_at_emit_time(capsys: pytest.CaptureFixture[str]) -> None:
    Events().emit("tools_list_served", client="claude-code", tools=3, passthrough=False)
    err = capsys.readouterr().err
    assert json.loads(err)["event"] == "tools_list_served"


def test_bad_names_and_broken_streams() -> None:
    with pytest.raises(ValueError, match="snake_case"):
        Events(io.StringIO()).emit("Tool Search")
    closed = io.StringIO()
    closed.close()
    Events(closed).emit("catalog_changed", added=1)  # must not raise


def test_lines_never_interleave_across_threads() -> None:
    buf = io.StringIO()
    ev = Events(buf)

    def burst(n: int) -> None:
        for i in range(200):
            ev.emit("execute_tool_completed", worker=n, i=i, payload="x" * 500)

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    lines = _lines(buf)
    assert len(lines) == 800
    assert all(len(line["payload"]) == 500 for line in lines)


def test_stable_event_names() -> None:
    assert EVENT_NAMES == {
        "tools_list_served", "tool_search_completed", "tool_search_fallback",
        "execute_tool_completed", "execute_tool_failed", "upstream_state_changed",
        "catalog_changed", "config_reloaded", "config_reload_rejected",
        "admin_command_completed", "admin_command_refused", "upstream_relisted", "access_denied",
        "upstream_approval_changed", "resource_read_completed", "prompt_get_completed",
    }


def test_the_readme_documents_every_event_with_its_fields() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("| event | fields |"):].split("\n\n", 1)[0].splitlines()[2:]
    rows = {m.group(1): m.group(2) for line in table if (m := re.match(r"^\| `([a-z_]+)` \| (.+) \|$", line))}
    assert set(rows) == set(EVENT_NAMES) and len(rows) == len(table)
    for name, fields in EVENT_FIELDS.items():
        if rows[name].startswith("audit fields, "):  # documented once, in the audit trail's table
            assert AUDIT_FIELDS <= fields and name in AUDIT_EVENTS
            fields = fields - AUDIT_FIELDS
        assert all(f"`{f}`" in rows[name] for f in fields), (name, rows[name])
    audit = readme[readme.index("**The audit trail.**"):].split("\n\n", 2)[1].splitlines()[2:]
    documented = {f for line in audit for f in re.findall(r"`([a-z_]+)`", line.split(" | ")[0])}
    assert documented == set(AUDIT_FIELDS), documented


def test_timestamps_follow_the_clock_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """rfc3339_now formats each second once; the cached part must move with the clock."""
    from toolatlas import events

    ns = [1_764_741_599_998_000_000, 1_764_741_599_999_900_000, 1_764_741_600_000_100_000, 1_764_741_599_500_000_000]
    real, given = events.time.time_ns, iter(ns)
    monkeypatch.setattr(events.time, "time_ns", lambda: next(given, None) or real())
    stamps = [events.rfc3339_now() for _ in range(4)]
    assert stamps == ["2025-12-03T05:59:59.998Z", "2025-12-03T05:59:59.999Z", "2025-12-03T06:00:00.000Z",
                      "2025-12-03T05:59:59.500Z"]
