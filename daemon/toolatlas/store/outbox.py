"""The on-disk write buffer between a replica and the shared store.

Every shared write (an event or a state value) is appended here first, fsynced, and only
then sent; the sender advances a `done` offset after the database committed it. So a write
survives the database being down (bounded: `max_bytes`), and a replica killed at any moment
loses nothing it had accepted: on the next start the writes after `done` are sent again, and
the store's idempotency keys make a write sent twice land once.

Files under `dir`: `outbox.jsonl` (one JSON record a line) and `outbox.done` (the byte
offset of the first unsent line). A torn last line (killed mid-append, never acknowledged)
is cut at open. Either file found to be something else than a regular file (a directory,
a FIFO, which would fail or block the open for good) is moved aside at open, logged, and
the outbox starts afresh. Thread-safe; blocking (call it from a worker thread).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from toolatlas.paths import read_regular, set_aside_unless_regular

log = logging.getLogger(__name__)


class Buffer(Protocol):
    """What the replica's sender reads: the outbox below, and the audit spool (audit.py)."""

    def peek(self, limit: int, /) -> tuple[list[dict[str, Any]], Any]: ...

    def mark_done(self, position: Any, count: int, /) -> None: ...


class BufferFull(Exception):
    """The buffer holds `max_bytes` of unsent writes already; this one is refused."""


class Outbox:
    """A bounded, durable FIFO of JSON records; see the module docstring."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int) -> None:
        self.dir = Path(folder)
        self.max_bytes = max_bytes
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._data = self.dir / "outbox.jsonl"
        self._done_file = self.dir / "outbox.done"
        self._lock = threading.Lock()
        self.refused = 0  # writes refused because the buffer was full
        self.corrupt = 0  # lines that were not JSON (skipped)
        self._size, self._done, self.pending_count = self._open()

    def __repr__(self) -> str:
        return f"<Outbox pending={self.pending_count} bytes={self.pending_bytes}>"

    @property
    def pending_bytes(self) -> int:
        return self._size - self._done

    def _open(self) -> tuple[int, int, int]:
        """(size, done offset, unsent lines), after cutting a torn tail."""
        for path in (self._data, self._done_file):
            aside = set_aside_unless_regular(path, time.time())
            if aside is not None:
                log.warning("store.outbox_unusable %s is not a regular file; moved to %s, the outbox starts afresh",
                            path, aside)
        # Usage events carry users' queries: the daemon's user alone reads them (as the
        # learning store), and a file an earlier version made with the umask's mode is narrowed.
        os.close(os.open(self._data, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        os.chmod(self._data, 0o600)
        with open(self._data, "ab+") as fh:
            fh.seek(0)
            raw = fh.read()
            if raw and not raw.endswith(b"\n"):
                cut = raw.rfind(b"\n") + 1
                log.warning("store.outbox_torn_tail: %d bytes of an unacknowledged write dropped", len(raw) - cut)
                fh.truncate(cut)
                raw = raw[:cut]
        try:
            done = int(read_regular(self._done_file).decode().strip() or 0)
        except FileNotFoundError:
            done = 0
        except (OSError, ValueError) as exc:  # sent again from the start: the idempotency keys absorb it
            log.warning("store.outbox_done_unreadable %s (%s): unsent writes are counted from the start",
                        self._done_file, exc)
            done = 0
        if done > len(raw):  # the data file was emptied after everything was sent
            done = 0
        elif done < 0 or (done and raw[done - 1:done] != b"\n"):  # never written so: edited by hand
            log.warning("store.outbox_done_unreadable %s (offset %d is not the end of a line): unsent writes are "
                        "counted from the start", self._done_file, done)
            done = 0
        return len(raw), done, raw[done:].count(b"\n")

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append `records` durably (fsync); BufferFull when they do not fit."""
        blob = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
        with self._lock:
            if self.pending_bytes + len(blob) > self.max_bytes:
                self.refused += len(records)
                raise BufferFull(f"the store's write buffer is full ({self.pending_bytes} of {self.max_bytes} "
                                 "bytes unsent while the database is unreachable)")
            with open(self._data, "ab") as fh:
                fh.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
            self._size += len(blob)
            self.pending_count += len(records)

    def peek(self, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Up to `limit` unsent records and the offset just after them (for `mark_done`)."""
        with self._lock:
            if self._done >= self._size:
                return [], self._done
            with open(self._data, "rb") as fh:
                fh.seek(self._done)
                out: list[dict[str, Any]] = []
                offset = self._done
                for line in fh:
                    if len(out) >= limit or not line.endswith(b"\n"):
                        break
                    offset += len(line)
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        self.corrupt += 1
                        log.warning("store.outbox_corrupt_line skipped at offset %d", offset - len(line))
            return out, offset

    def mark_done(self, offset: int, count: int) -> None:
        """The records before `offset` (`count` of them) are in the database."""
        with self._lock:
            self._done = offset
            self.pending_count = max(0, self.pending_count - count)
            self._write_done(offset)
            if self._done >= self._size:
                # Everything is sent: start the file afresh (done first, so a crash in
                # between re-sends at worst, which the idempotency keys absorb).
                with open(self._data, "r+b") as fh:
                    fh.truncate(0)
                    os.fsync(fh.fileno())
                self._size = self._done = 0
                self._write_done(0)

    def _write_done(self, offset: int) -> None:
        tmp = self._done_file.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(str(offset))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._done_file)


__all__ = ["Buffer", "BufferFull", "Outbox"]
