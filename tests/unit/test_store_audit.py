"""The shared audit trail's spool (store/audit.py): what the events writer appends is read
back in order as store writes, survives a reopen (a restarted replica), is deleted once sent,
and is bounded. Pure file I/O."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolatlas.events import Events
from toolatlas.store.audit import AuditSpool


def record(i: int) -> tuple[dict[str, Any], str]:
    rec = {"ts": "2026-12-02T12:00:00.000Z", "event": "tool_search_completed", "principal": f"uid:{i}",
           "request": i, "text": "é\n\"quoted\""}
    return rec, json.dumps(rec, ensure_ascii=False)


def drain(spool: AuditSpool, limit: int = 1000) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(10_000):  # bounded
        got, pos = spool.peek(limit)
        if not got:
            return out
        spool.mark_done(pos, len(got))
        out += got
    raise AssertionError("the spool never emptied")


def test_records_come_back_as_idempotent_store_writes_in_order(tmp_path: Path) -> None:
    spool = AuditSpool(tmp_path, 1 << 20, "host:abc")
    for i in range(5):
        spool.append(*record(i))
    assert spool.pending_count == 5
    got = drain(spool, limit=2)
    spool.close()
    assert [r["body"]["request"] for r in got] == [0, 1, 2, 3, 4]
    assert {(r["t"], r["kind"], r["origin"]) for r in got} == {("event", "audit", "host:abc")}
    assert [r["key"] for r in got] == [f"uid:{i}" for i in range(5)]
    assert len({r["idem"] for r in got}) == 5 and got[0]["body"] == record(0)[0]
    assert spool.pending_count == 0 and spool.pending_bytes == 0


def test_unsent_records_survive_a_restart_and_sent_ones_are_not_sent_again(tmp_path: Path) -> None:
    spool = AuditSpool(tmp_path, 1 << 20, "a", segment_bytes=600)  # several segments
    for i in range(12):
        spool.append(*record(i))
    assert len(list(tmp_path.glob("*.jsonl"))) == 6
    for _ in range(2):  # one segment at most a time: two records
        got, pos = spool.peek(3)
        spool.mark_done(pos, len(got))
    unsent, _ = spool.peek(2)  # read but never marked done (killed before the commit)
    spool.close()  # or SIGKILLed: every append was one write(2), already in the file
    again = AuditSpool(tmp_path, 1 << 20, "a", segment_bytes=600)
    assert again.pending_count == 8
    rest = drain(again)
    assert [r["body"]["request"] for r in rest] == list(range(4, 12))
    assert rest[0]["idem"] == unsent[0]["idem"]  # the same key: the store drops a second copy
    again.append(*record(99))
    assert [r["body"]["request"] for r in drain(again)] == [99]
    again.close()
    segments = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert len(segments) == 1  # the sent segments are gone; the head remains
    third = AuditSpool(tmp_path, 1 << 20, "a")
    assert third.pending_count == 0 and drain(third) == []
    third.close()


def test_a_torn_last_line_is_cut_and_a_cursor_past_the_end_is_clamped(tmp_path: Path) -> None:
    spool = AuditSpool(tmp_path, 1 << 20, "a")
    spool.append(*record(1))
    got, pos = spool.peek(10)
    spool.mark_done(pos, 1)
    spool.append(*record(2))
    spool.close()
    head = next(tmp_path.glob("*.jsonl"))
    with open(head, "ab") as fh:
        fh.write(b'{"t":"event","kind":"au')  # a crash mid-line
    again = AuditSpool(tmp_path, 1 << 20, "a")
    assert [r["body"]["request"] for r in drain(again)] == [2]
    again.close()
    # A machine crash lost bytes the cursor had passed (never synced): nothing is re-read.
    head.write_bytes(b"")
    third = AuditSpool(tmp_path, 1 << 20, "a")
    third.append(*record(3))
    assert [r["body"]["request"] for r in drain(third)] == [3]
    third.close()


def test_it_is_bounded(tmp_path: Path) -> None:
    rec, line = record(0)
    probe = AuditSpool(tmp_path / "probe", 1 << 20, "a")
    probe.append(rec, line)
    size = probe.pending_bytes  # one record as spooled
    probe.close()
    spool = AuditSpool(tmp_path / "spool", 3 * size + size // 2, "a")
    for _ in range(10):
        spool.append(rec, line)
    assert spool.pending_count == 3 and spool.refused == 7
    drain(spool)
    spool.append(rec, line)  # room again once sent
    assert spool.pending_count == 1
    spool.close()


def test_the_events_writer_feeds_both_sinks_with_audit_events_only(tmp_path: Path) -> None:
    import io

    spool = AuditSpool(tmp_path / "spool", 1 << 20, "a")
    events = Events(io.StringIO(), secrets=["s3cret"])
    events.shared_audit = spool
    events.emit("tool_search_completed", principal="uid:1", results=2, message="token s3cret")
    events.emit("upstream_state_changed", upstream="one", old="a", new="b", reason="")
    events.emit("upstream_approval_changed", upstream="one", old=None, new="approved", by="ops", reason="")
    got = drain(spool)
    spool.close()
    assert [(r["key"], r["body"]["event"]) for r in got] == [
        ("uid:1", "tool_search_completed"), ("one", "upstream_approval_changed")]
    assert "s3cret" not in json.dumps(got)
