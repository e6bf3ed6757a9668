"""The audit file: mode 0600, one JSON line per record, size-based rotation with a bounded
number of files, and writes that never raise."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from toolatlas.auditlog import AuditFile


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_lines_mode_and_rotation_bound(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "audit.jsonl"
    sink = AuditFile(path, max_bytes=4096, keep=2, fsync_interval=0.05)
    try:
        for i in range(400):
            line = json.dumps({"event": "tool_search_completed", "n": i, "pad": "x" * 40})
            sink.append({}, line)
        sink.sync()
    finally:
        sink.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"], files
    numbers: list[int] = []
    for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"):
        p = path.parent / name
        assert _mode(p) == 0o600, (name, oct(_mode(p)))
        assert p.stat().st_size <= 4096
        numbers += [json.loads(line)["n"] for line in p.read_text().splitlines()]
    # the newest lines survive, in order, none torn; older files were dropped (bounded count)
    assert numbers == list(range(numbers[0], 400)) and numbers[0] > 0


def test_existing_file_is_tightened_and_appended(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"old": 1}\n')
    os.chmod(path, 0o644)
    sink = AuditFile(path, max_bytes=1 << 20, keep=1)
    sink.append({}, '{"new": 2}')
    sink.close()
    assert _mode(path) == 0o600
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"old": 1}, {"new": 2}]
    sink.append({}, '{"late": 3}')  # after close: dropped, no exception
    assert "late" not in path.read_text()


def test_keep_zero_keeps_only_the_live_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    sink = AuditFile(path, max_bytes=4096, keep=0)
    for i in range(200):
        sink.append({}, json.dumps({"n": i, "pad": "y" * 50}))
    sink.close()
    assert [p.name for p in tmp_path.iterdir()] == ["audit.jsonl"]
    assert json.loads(path.read_text().splitlines()[-1])["n"] == 199
