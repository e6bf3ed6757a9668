"""Child processes of the tests, read from /proc (no psutil)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if the test process dies (no orphaned servers)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first, then ppid), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is parenthesised and may itself contain spaces or parentheses.
    return stat.rsplit(")", 1)[1].split()


def parent_of(pid: int | str) -> int | None:
    """The parent pid of ``pid``, or None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _live_parents() -> dict[int, list[int]]:
    """ppid -> its live (not zombie) children, for every process in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def children_of(pid: int) -> list[int]:
    """Direct live children of ``pid``."""
    return sorted(_live_parents().get(pid, []))


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    children = _live_parents()
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL every pid still alive (the leftovers of a daemon that could not reap them)."""
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_gone(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Poll until none of ``pids`` is alive or ``timeout`` passes; returns those still alive."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if pid_alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)
