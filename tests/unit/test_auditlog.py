"""The audit file: mode 0600, one JSON line per record, size-based rotation with a bounded
number of files, and writes that never raise."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
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


def test_a_lower_keep_drops_the_files_past_it_at_the_next_rotation(tmp_path: Path) -> None:
    """audit_keep lowered (a reload sets `keep`, or a restart with the new value): the next
    rotation leaves at most keep + 1 files, not the old .N files past keep for ever; files
    that are not the rotation's own (.gz, other names) are left alone."""
    path = tmp_path / "audit.jsonl"
    (tmp_path / "audit.jsonl.2.gz").write_text("compressed by someone else")
    sink = AuditFile(path, max_bytes=4096, keep=4)
    try:
        for i in range(300):
            sink.append({}, json.dumps({"n": i, "pad": "z" * 40}))
        assert (tmp_path / "audit.jsonl.4").exists()
        sink.keep = 1
        for i in range(300, 400):
            sink.append({}, json.dumps({"n": i, "pad": "z" * 40}))
    finally:
        sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2.gz"]


def test_a_file_deleted_or_moved_away_is_opened_again_at_its_path(tmp_path: Path) -> None:
    """Someone removes the audit file, or rotates it from outside (mv, as logrotate does),
    while the daemon runs: within the flusher's interval the path is a file again and the
    next lines go there, not into an unlinked or renamed inode where no one finds them."""
    path = tmp_path / "audit.jsonl"
    sink = AuditFile(path, max_bytes=1 << 20, keep=1, fsync_interval=0.02)
    try:
        sink.append({}, '{"n": 1}')
        path.unlink()
        assert until_sync(lambda: path.exists()), "the deleted audit file was not created again"
        sink.append({}, '{"n": 2}')
        assert [json.loads(x) for x in path.read_text().splitlines()] == [{"n": 2}]
        assert _mode(path) == 0o600
        moved = tmp_path / "audit.jsonl.outside"
        path.rename(moved)
        assert until_sync(lambda: path.exists()), "the moved audit file was not created again"
        sink.append({}, '{"n": 3}')
        assert [json.loads(x) for x in moved.read_text().splitlines()] == [{"n": 2}]
        assert [json.loads(x) for x in path.read_text().splitlines()] == [{"n": 3}]
    finally:
        sink.close()


_FULL_DISK = """
import json, os, resource, signal, sys
from toolatlas.auditlog import AuditFile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
path = sys.argv[1]
sink = AuditFile(path, max_bytes=1 << 20, keep=1)
sink.append({}, json.dumps({"n": 1}))
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 10, hard))
sink.append({}, json.dumps({"n": 2, "pad": "x" * 100}))  # 10 bytes fit, then the "disk" is full
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
sink.append({}, json.dumps({"n": 3}))  # room again
sink.close()
print(sink.failures)
"""


def test_a_line_cut_by_a_full_disk_leaves_no_fragment_for_the_next_line(tmp_path: Path) -> None:
    """A full disk lets part of a line in, then fails: that line is lost (counted), but the
    file keeps only whole JSON lines, so the next line written once there is room again is
    not glued to the fragment (two records lost, the file no longer JSON lines). The "disk"
    is a real file-size limit (RLIMIT_FSIZE) in a child process."""
    import subprocess
    import sys

    path = tmp_path / "audit.jsonl"
    run = subprocess.run([sys.executable, "-c", _FULL_DISK, str(path)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0 and run.stdout.strip() == "1", run.stdout + run.stderr
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"n": 1}, {"n": 3}], path.read_text()


def until_sync(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `pred` (the flusher thread acts on its own schedule) until true or the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False
