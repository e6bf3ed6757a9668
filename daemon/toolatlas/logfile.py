"""The log of a daemon the shim started (`STATE_DIR/daemon.log`), kept bounded.

A daemon that `toolatlas shim --config` starts writes its log lines and events to a file the
shim opened for appending. Nothing rotates that file (journald bounds the systemd service's
log), and every search and call adds an event line, so months of use would fill the disk.
The shim sets `TOOLATLAS_LOG_MAX_BYTES`; the daemon then looks at its stderr once a minute
and, past that size, copies it to `<log>.1` (mode 0600, replacing the previous copy) and
truncates it: logrotate's "copytruncate". The descriptor stays open and, in append mode,
the next line lands at the start of the file. A line written between the copy and the
truncation is lost (at most the few of that instant); a stderr that is not a regular file
opened for appending is left alone (truncating it would leave a hole before the next line).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat

import anyio
import anyio.abc

log = logging.getLogger(__name__)

ENV = "TOOLATLAS_LOG_MAX_BYTES"
DEFAULT_MAX_BYTES = 10 * 1024 * 1024  # what the shim asks for: ~40,000 event lines
CHECK_EVERY_S = 60.0


def max_bytes_from_env() -> int | None:
    """The bound the shim asked for, or None (a daemon started otherwise, or a bad value).
    Taken out of the environment: no process the daemon starts inherits it."""
    text = os.environ.pop(ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def rotate_if_large(fd: int, max_bytes: int) -> str | None:
    """Copy the file open on `fd` to `<its path>.1` and truncate it when it is a regular file
    in append mode holding more than `max_bytes`; the copy's path, else None. Blocking."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size <= max_bytes or not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
        return None
    path = os.readlink(f"/proc/self/fd/{fd}")
    if not os.path.isabs(path) or path.endswith(" (deleted)"):
        return None
    older = path + ".1"
    tmp = older + ".tmp"
    with open(f"/proc/self/fd/{fd}", "rb") as src, \
            open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, older)
    os.ftruncate(fd, 0)
    return older


async def keep_bounded(max_bytes: int, fd: int = 2, *,
                       task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Once a minute, `rotate_if_large(fd, max_bytes)`; a failure is logged and tried again."""
    task_status.started()
    while True:
        await anyio.sleep(CHECK_EVERY_S)
        try:
            older = await anyio.to_thread.run_sync(rotate_if_large, fd, max_bytes)
        except OSError as exc:
            log.warning("log: could not keep the log under %d bytes: %s", max_bytes, exc)
            continue
        if older is not None:
            log.info("log: it passed %d bytes; the lines before this one are in %s", max_bytes, older)


__all__ = ["CHECK_EVERY_S", "DEFAULT_MAX_BYTES", "ENV", "keep_bounded", "max_bytes_from_env", "rotate_if_large"]
