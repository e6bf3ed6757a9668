"""The shared audit trail: with `[store] url` and `[events] audit_file` set, every audit record
this replica writes to its audit file is also logged in the store (events of kind `audit`,
ports.AUDIT), so the platform team reads one trail of every replica (the view
`toolatlas_audit`, schema.py).

`AuditSpool` is an `auditlog.AuditSink`. The events writer calls `append` on whatever thread
emits, on the search and call paths, so it costs what the audit file costs: one `write(2)`
of one line, no fsync and no lock the sender holds for long, into a spool under
`state_dir/store/audit/`. A SIGKILL then loses nothing `append` wrote; a crash of the machine
at most the last second (a flusher thread fsyncs once a second, as the audit file's does).
Each line is a buffered write as the outbox holds them, with its own idempotency key.

The replica's sender reads the spool in batches (`peek`), commits them with the store's
idempotent write (a batch sent twice lands once), then moves the spool's cursor
(`mark_done`, fsynced). The spool is a series of segment files (`NNNNNNNNNN.jsonl`, a new
one past `segment_bytes`); a segment wholly sent is deleted, so the writer never waits for a
truncation. Bounded: past `max_bytes` unsent, a record is refused (counted, logged once a
minute; it is still in the audit file).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolatlas.auditlog import SyncedAppender, fsync_close
from toolatlas.paths import read_regular, set_aside_unless_regular, write_atomic
from toolatlas.store.ports import AUDIT

log = logging.getLogger(__name__)

SEGMENT_BYTES = 4 * 1024 * 1024  # a new segment file past this
ROLL_WHEN_SENT_BYTES = 256 * 1024  # a fully sent head segment this big is replaced by a new one
FSYNC_INTERVAL_S = 1.0
REFUSAL_LOG_INTERVAL_S = 60.0
_SEGMENT = re.compile(r"^(\d{10})\.jsonl$")


class AuditSpool(SyncedAppender):
    """A durable, bounded FIFO of audit records bound for the store; see the module docstring."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int, origin: str, *,
                 segment_bytes: int = SEGMENT_BYTES, fsync_interval: float = FSYNC_INTERVAL_S) -> None:
        self.dir = Path(folder)
        self.max_bytes, self.segment_bytes = max_bytes, segment_bytes
        self.refused = 0  # records refused: the spool was full
        self.failures = 0  # records lost: the disk refused the write
        self.corrupt = 0  # lines that were not JSON (skipped)
        self._origin = json.dumps(origin)
        # Idempotency keys: random per run, then a counter (cheaper than a uuid4 per record).
        self._idem_prefix = secrets.token_hex(8)
        self._idem_next = 0
        self._lock = threading.Lock()  # the writer's state below; held for a write(2) at most
        self._refusal_logged_at = float("-inf")
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._cursor_file = self.dir / "cursor"
        self._sizes, (self._seg, self._off) = self._recover()
        self._head = max(self._sizes)
        self._fd = self._open(self._head)
        self.pending_count = self._count_pending()
        self._dirty = False
        self._retired: list[int] = []  # fds of finished segments, synced and closed by the flusher
        self._start_flusher(fsync_interval, "toolatlas-audit-spool")

    def __repr__(self) -> str:
        return f"<AuditSpool pending={self.pending_count} bytes={self.pending_bytes} segments={len(self._sizes)}>"

    @property
    def pending_bytes(self) -> int:
        with self._lock:
            return sum(size for seg, size in self._sizes.items() if seg >= self._seg) - self._off

    def _path(self, seg: int) -> Path:
        return self.dir / f"{seg:010d}.jsonl"

    def _open(self, seg: int) -> int:
        return os.open(self._path(seg), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _recover(self) -> tuple[dict[int, int], tuple[int, int]]:
        """The segments left (those wholly sent deleted, a torn tail cut) and the read position."""
        try:  # a directory or a FIFO there (a plain read waits for good) is moved aside, logged
            if (aside := set_aside_unless_regular(self._cursor_file, time.time())) is not None:
                log.warning("store.audit_cursor_unusable %s is not a regular file; moved to %s, the spool is "
                            "sent again from its first segment", self._cursor_file, aside)
            seg_s, off_s = read_regular(self._cursor_file).decode().split()
            cursor = (int(seg_s), int(off_s))
        except (FileNotFoundError, ValueError):
            cursor = (0, 0)
        sizes: dict[int, int] = {}
        for path in self.dir.iterdir():
            m = _SEGMENT.match(path.name)
            if m is None:
                continue
            if (aside := set_aside_unless_regular(path, time.time())) is not None:  # opening it fails or blocks
                log.warning("store.audit_segment_unusable %s is not a regular file; moved to %s", path, aside)
                continue
            seg = int(m.group(1))
            if seg < cursor[0]:
                path.unlink(missing_ok=True)  # sent before the last stop
            else:
                sizes[seg] = path.stat().st_size
        if sizes:
            last = max(sizes)
            with open(self._path(last), "rb+") as fh:  # a line torn by a crash was never acknowledged
                raw = fh.read()
                if raw and not raw.endswith(b"\n"):
                    cut = raw.rfind(b"\n") + 1
                    log.warning("store.audit_torn_tail: %d bytes of an unfinished audit line dropped", len(raw) - cut)
                    fh.truncate(cut)
                    sizes[last] = cut
        if cursor[0] in sizes:  # a crash may have lost unsynced bytes the cursor had passed
            return sizes, (cursor[0], min(cursor[1], sizes[cursor[0]]))
        first = min(sizes) if sizes else cursor[0] + 1
        sizes.setdefault(first, 0)
        return sizes, (first, 0)

    def _count_pending(self) -> int:
        n = 0
        for seg in sorted(s for s in self._sizes if s >= self._seg):
            with open(self._path(seg), "rb") as fh:
                if seg == self._seg:
                    fh.seek(self._off)
                n += fh.read().count(b"\n")
        return n

    # -- the events writer's side ----------------------------------------------------------

    def append(self, record: Mapping[str, Any], line: str) -> None:
        """Spool one audit record (`line`: its JSON, as in the audit file). Never raises."""
        key = record.get("principal") or record.get("upstream") or record.get("event") or ""
        with self._lock:
            if self._fd < 0:
                return
            self._idem_next += 1
            data = (f'{{"t":"event","kind":"{AUDIT}","key":{json.dumps(str(key))},"origin":{self._origin},'
                    f'"idem":"{self._idem_prefix}{self._idem_next}","at":{time.time()!r},"body":{line}}}\n').encode()
            pending = sum(size for seg, size in self._sizes.items() if seg >= self._seg) - self._off
            if pending + len(data) > self.max_bytes:
                self._refuse(pending)
                return
            try:
                if self._sizes[self._head] and self._sizes[self._head] + len(data) > self.segment_bytes:
                    self._roll()
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError as exc:
                self.failures += 1
                log.warning("store.audit_spool_write_failed: %s; the record is in the audit file only",
                            exc.strerror or exc)
                self._resize()
                return
            self._sizes[self._head] += len(data)
            self.pending_count += 1
            self._dirty = True

    def _resize(self) -> None:
        """Under the lock, after a failed write: the head's size as on disk (a partial line
        there merges with the next one into a line `peek` skips as corrupt)."""
        try:
            self._sizes[self._head] = os.fstat(self._fd).st_size
        except OSError:
            pass

    def _roll(self) -> None:
        """Under the lock: a new head segment (the old fd is synced and closed by the flusher)."""
        fd = self._open(self._head + 1)
        if self._fd >= 0:
            self._retired.append(self._fd)
        self._head += 1
        self._fd = fd
        self._sizes[self._head] = 0

    def _refuse(self, pending: int) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._refusal_logged_at = now
            log.warning("store.audit_spool_full: %d of %d bytes unsent; %d audit record(s) kept in the audit file "
                        "only so far", pending, self.max_bytes, self.refused)

    # -- the sender's side (one task, from a worker thread: blocking) -----------------------

    def peek(self, limit: int) -> tuple[list[dict[str, Any]], tuple[int, int]]:
        """Up to `limit` unsent records (from one segment) and the position after them."""
        with self._lock:
            seg, off = self._seg, self._off
            while off >= self._sizes.get(seg, 0) and seg < self._head:
                seg, off = seg + 1, 0  # that segment is wholly sent: the next one
            end = self._sizes.get(seg, 0)
        out: list[dict[str, Any]] = []
        if off >= end:
            return out, (seg, off)
        with open(self._path(seg), "rb") as fh:
            fh.seek(off)
            raw = fh.read(end - off)  # only what `append` had finished writing
        for line in raw.split(b"\n")[:-1]:
            if len(out) >= limit:
                break
            off += len(line) + 1
            try:
                out.append(json.loads(line))
            except ValueError:
                self.corrupt += 1
                log.warning("store.audit_spool_corrupt_line skipped in segment %d", seg)
        return out, (seg, off)

    def mark_done(self, position: tuple[int, int], count: int) -> None:
        """The records before `position` (`count` of them) are in the database."""
        seg, off = position
        with self._lock:
            self._seg, self._off = seg, off
            self.pending_count = max(0, self.pending_count - count)
            if seg == self._head and off == self._sizes[seg] and off >= ROLL_WHEN_SENT_BYTES and self._fd >= 0:
                self._roll()
                self._seg, self._off = self._head, 0
            gone = [s for s in self._sizes if s < self._seg]
            for s in gone:
                del self._sizes[s]
        write_atomic(self._cursor_file, f"{self._seg} {self._off}".encode(), 0o600)
        for s in gone:  # after the cursor moved past them: a crash in between sends nothing twice
            self._path(s).unlink(missing_ok=True)

    # -- durability ------------------------------------------------------------------------

    def sync(self) -> None:
        """fsync what was appended since the last sync, and the segments retired since."""
        with self._lock:
            retired, self._retired = self._retired, []
            fd = os.dup(self._fd) if self._dirty and self._fd >= 0 else -1
            self._dirty = False
        for old in [*retired, fd] if fd >= 0 else retired:
            fsync_close(old, "store.audit_spool")


__all__ = ["AuditSpool"]
