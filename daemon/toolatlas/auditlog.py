"""The audit file (`[events] audit_file`): audit events as JSON lines, mode 0600, rotated by size.

Durability: each line is one `write(2)` straight to the file (opened `O_APPEND`, no buffer
in the process), so a crash of the daemon loses nothing it had written; a flusher thread
`fsync`s the file once a second while lines were added since the last sync, so a crash of
the machine (power, kernel) loses at most the last second. Rotation (when the next line
would take the file over `max_bytes`): `PATH` becomes `PATH.1`, `PATH.1` becomes `PATH.2`,
... and `PATH.KEEP` is deleted (and any `PATH.N` past it, left by a larger `keep` before a
reload or restart), so at most `keep + 1` files exist; the file is synced before
it is renamed, and the folder after. A write that fails (a full disk) loses that line, is
counted in `failures` and logged once a minute; it never raises into the daemon. A line that
got in only in part is cut off again, so the file keeps whole lines.

`AuditSink` is the small interface the events writer uses, so another store (a database)
can take the audit records instead of, or beside, the file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

FSYNC_INTERVAL_S = 1.0
FAILURE_LOG_INTERVAL_S = 60.0
FILE_MODE = 0o600


class AuditSink(Protocol):
    """Where audit records go: `append` takes the record and its JSON line (no newline);
    it must not raise. `close` flushes and releases it."""

    def append(self, record: Mapping[str, Any], line: str) -> None: ...

    def close(self) -> None: ...


def fsync_close(fd: int, what: str) -> None:
    """fsync then close `fd` (a dup taken under a writer's lock); a failed fsync is logged."""
    try:
        os.fsync(fd)
    except OSError as exc:
        log.warning("%s: fsync failed: %s", what, exc.strerror or exc)
    finally:
        os.close(fd)


class SyncedAppender:
    """An append-only file whose writers never wait for the disk: a background thread calls
    `sync()` every `interval` seconds, and `close()` syncs once more. Subclasses hold `_fd`
    (-1 once closed) under `_lock` and implement `sync`."""

    _lock: threading.Lock
    _fd: int

    def _start_flusher(self, interval: float, name: str) -> None:
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, args=(interval,), name=name, daemon=True)
        self._flusher.start()

    def sync(self) -> None:
        raise NotImplementedError

    def _flush_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sync()

    def close(self) -> None:
        """Sync and close; later appends are dropped."""
        self._stop.set()
        self.sync()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class AuditFile(SyncedAppender):
    """See the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int, keep: int,
                 fsync_interval: float = FSYNC_INTERVAL_S) -> None:
        """Open (create, mode 0600) `path` for appending. OSError when it cannot be opened."""
        self.path = Path(path)
        self.max_bytes, self.keep = max_bytes, keep
        self.failures = 0
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size
        self._dirty = False
        self._torn = False  # the last line was cut part way and the fragment is still there
        self._failure_logged_at = float("-inf")
        self._start_flusher(fsync_interval, "toolatlas-audit-fsync")

    def __repr__(self) -> str:
        return f"<AuditFile {str(self.path)!r} size={self._size} failures={self.failures}>"

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # an older file (or a umask) must not leave it readable by others
        return fd

    def append(self, record: Mapping[str, Any], line: str) -> None:
        data = line.encode("utf-8") + b"\n"
        with self._lock:
            if self._fd < 0:
                return
            if self._torn:  # a fragment we could not cut off ends the line before this one
                data = b"\n" + data
            view = memoryview(data)
            try:
                if self._size and self._size + len(data) > self.max_bytes:
                    self._rotate()
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
                self._size += len(data)
                self._dirty = True
                self._torn = False
            except OSError as exc:
                if len(view) < len(data):
                    self._cut(len(data) - len(view))
                self._failed(exc)

    def _cut(self, written: int) -> None:
        """Under the lock, after a write that failed part way (a full disk): take the part
        of the line that got in off the end again, so the file keeps whole lines and the
        next line is not glued to a fragment; failing that, the next line starts on a new
        line (`_torn`)."""
        try:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
        except OSError:
            self._size += written
            self._torn = True

    def _rotate(self) -> None:
        """Under the lock: sync and close the file, shift the numbered ones, open a fresh one."""
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        for stale in self._numbered(past=self.keep - 1):  # `keep` lowered since: those past it too
            stale.unlink(missing_ok=True)
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.keep > 0:
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._fd = self._open()
        self._size = 0
        self._sync_dir()

    def _numbered(self, *, past: int) -> list[Path]:
        """The rotated files `PATH.N` (N from 1, in plain digits: a `.2.gz` someone else made
        is not one) with N > `past`."""
        prefix = f"{self.path.name}."
        try:
            names = os.listdir(self.path.parent)
        except OSError:
            return []
        numbers = (n[len(prefix):] for n in names if n.startswith(prefix))
        return [self.path.with_name(prefix + n) for n in numbers
                if n.isascii() and n.isdigit() and not n.startswith("0") and int(n) > past]

    def _sync_dir(self) -> None:
        try:
            dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)

    def _follow_path(self) -> None:
        """Under the lock: when `path` no longer names the file written (deleted, or renamed by
        logrotate or a person), open a new file there. Lines written since went to the old one."""
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            here = None
        except OSError:
            return
        mine = os.fstat(self._fd)
        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = self._open()
        except OSError as exc:  # the lines go on to the old file meanwhile
            now = time.monotonic()
            if now - self._failure_logged_at >= FAILURE_LOG_INTERVAL_S:
                self._failure_logged_at = now
                log.warning("audit file %s was moved or deleted and cannot be created again (%s); "
                            "writing on to the old file", self.path, exc.strerror or exc)
            return
        old, self._fd, self._size = self._fd, fd, os.fstat(fd).st_size
        fsync_close(old, f"audit file {self.path} (the one moved or deleted)")
        log.warning("audit file %s was %s while the daemon ran; writing to a new file there", self.path,
                    "deleted or moved away" if here is None else "replaced by another file")

    def _failed(self, exc: OSError) -> None:
        self.failures += 1
        if self._fd < 0:  # a failed rotation: try to go on writing to a fresh file
            try:
                self._fd = self._open()
                self._size = os.fstat(self._fd).st_size
            except OSError:
                self._fd = -1
        now = time.monotonic()
        if now - self._failure_logged_at >= FAILURE_LOG_INTERVAL_S:
            self._failure_logged_at = now
            log.warning("audit file %s: cannot write (%s); %d line(s) lost so far", self.path,
                        exc.strerror or exc, self.failures)

    def sync(self) -> None:
        """fsync now if lines were added since the last sync; first, a file deleted or moved
        away from `path` (an outside rotation) is replaced by a new one there (`_follow_path`)."""
        with self._lock:
            if self._fd >= 0:
                self._follow_path()
            if self._fd < 0 or not self._dirty:
                return
            self._dirty = False
            try:
                fd = os.dup(self._fd)  # synced outside the lock: writers never wait for the disk
            except OSError:
                return
        fsync_close(fd, f"audit file {self.path}")


__all__ = ["AuditFile", "AuditSink", "FSYNC_INTERVAL_S", "SyncedAppender", "fsync_close"]
