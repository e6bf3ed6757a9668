"""The shared store's on-disk write buffer (store/outbox.py) and its schema plan: pure file I/O."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from toolatlas.store import schema
from toolatlas.store.outbox import BufferFull, Outbox


def rec(i: int) -> dict[str, object]:
    return {"t": "event", "kind": "feedback", "key": f"k{i}", "body": {"i": i}, "idem": f"id{i}"}


def test_writes_survive_a_reopen_until_marked_done(tmp_path: Path) -> None:
    box = Outbox(tmp_path, 1 << 20)
    box.append([rec(1), rec(2)])
    box.append([rec(3)])
    again = Outbox(tmp_path, 1 << 20)  # a restarted replica
    assert again.pending_count == 3
    got, offset = again.peek(2)
    assert [r["key"] for r in got] == ["k1", "k2"]
    again.mark_done(offset, len(got))
    third = Outbox(tmp_path, 1 << 20)
    got, offset = third.peek(10)
    assert [r["key"] for r in got] == ["k3"] and third.pending_count == 1
    third.mark_done(offset, 1)
    assert third.pending_count == 0 and third.pending_bytes == 0
    assert (tmp_path / "outbox.jsonl").stat().st_size == 0  # emptied once everything was sent
    assert Outbox(tmp_path, 1 << 20).peek(10) == ([], 0)


def test_the_buffered_writes_are_readable_by_the_daemon_s_user_only(tmp_path: Path) -> None:
    """They hold what the shared store gets (usage events carry users' queries): mode 0600 under
    any umask, and a file an earlier version made with the umask's mode is narrowed at open."""
    old = os.umask(0o022)
    try:
        box = Outbox(tmp_path / "fresh", 1 << 20)
        box.append([rec(1)])
        assert stat.S_IMODE((tmp_path / "fresh" / "outbox.jsonl").stat().st_mode) == 0o600
        (tmp_path / "old").mkdir()
        (tmp_path / "old" / "outbox.jsonl").write_bytes(b"")
        (tmp_path / "old" / "outbox.jsonl").chmod(0o644)
        Outbox(tmp_path / "old", 1 << 20)
        assert stat.S_IMODE((tmp_path / "old" / "outbox.jsonl").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_a_torn_last_line_is_cut_at_open(tmp_path: Path) -> None:
    box = Outbox(tmp_path, 1 << 20)
    box.append([rec(1)])
    with open(tmp_path / "outbox.jsonl", "ab") as fh:
        fh.write(b'{"t":"event","kind":"fee')  # killed mid-append: never acknowledged
    again = Outbox(tmp_path, 1 << 20)
    again.append([rec(2)])
    got, _ = again.peek(10)
    assert [r["key"] for r in got] == ["k1", "k2"]


def test_the_buffer_is_bounded(tmp_path: Path) -> None:
    box = Outbox(tmp_path, 4096)
    with pytest.raises(BufferFull, match="buffer is full"):
        for i in range(1000):
            box.append([rec(i)])
    assert box.refused == 1
    assert box.pending_bytes <= 4096
    kept = box.pending_count
    got, offset = box.peek(10_000)
    assert len(got) == kept and [r["key"] for r in got] == [f"k{i}" for i in range(kept)]
    box.mark_done(offset, len(got))
    box.append([rec(9999)])  # room again once sent


def test_migrations_are_numbered_in_order_and_planned_once() -> None:
    versions = [m[0] for m in schema.MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
    assert [m[0] for m in schema.pending(set())] == versions
    assert schema.pending(set(versions)) == []
    assert schema.pending({*versions, 999}) == []  # a newer replica's migration is left alone


@pytest.mark.parametrize("done", ["-5", "7"])
def test_a_done_offset_that_is_not_a_line_end_sends_everything_again(tmp_path: Path, done: str) -> None:
    """outbox.done only ever holds 0 or the end of a sent line; a negative offset or one inside
    a line (a hand edit) made peek() seek there (ValueError, or half a line read as a record).
    Everything is sent again instead: the store's idempotency keys absorb the repeats."""
    box = Outbox(tmp_path, 1 << 20)
    box.append([rec(1), rec(2)])
    (tmp_path / "outbox.done").write_text(done)
    again = Outbox(tmp_path, 1 << 20)
    got, _ = again.peek(10)
    assert [r["key"] for r in got] == ["k1", "k2"] and again.pending_count == 2
