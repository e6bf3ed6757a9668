"""`toolatlas shim --config PATH` starts the daemon when its socket does not answer.

One daemon per socket however many shims start at once: a shim takes an exclusive flock on
`SOCKET.lock` (next to the socket, in the runtime dir) before it starts one, and hands the
locked descriptor to the daemon, which holds it for its whole life. A shim that finds the
lock taken knows a daemon runs or is being started, and only waits for the socket. The
kernel drops the lock when the daemon exits, however it exits.

The daemon is detached from the client: a new session (no terminal signals, it outlives the
shim), stdin from /dev/null, stdout and stderr appended to `STATE_DIR/daemon.log`.

Stdlib only (the shim imports it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from typing import TYPE_CHECKING

from toolatlas.paths import socket_answers

if TYPE_CHECKING:
    import subprocess

SPAWN_RETRY_S = 10.0  # a shim starts a daemon at most this often (one that dies at once is not respawned in a loop)
LOG_NAME = "daemon.log"
# The daemon keeps that log under this size, its older lines in daemon.log.1 (toolatlas.logfile).
LOG_MAX_ENV, LOG_MAX_BYTES = "TOOLATLAS_LOG_MAX_BYTES", 10 * 1024 * 1024


def lock_path(socket_path: str) -> str:
    return socket_path + ".lock"


class StartFailed(Exception):
    """The daemon could not be started (its socket folder, lock or log cannot be made); the
    message says which path and why, for the client: retrying will not help until that is fixed."""


class Starter:
    """Starts `toolatlas serve --config CONFIG` for a shim (see the module docstring)."""

    def __init__(self, config: str, socket_path: str, state_dir: str) -> None:
        self.config = os.path.abspath(config)
        self.socket_path = socket_path
        self.log = os.path.join(state_dir, LOG_NAME)
        self.proc: subprocess.Popen[bytes] | None = None
        self._last_start = -SPAWN_RETRY_S

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc is not None else None
        return f"<Starter {self.config} socket={self.socket_path} daemon_pid={pid}>"

    def start(self, why: OSError | None = None) -> str | None:
        """Start the daemon unless one runs or is being started; a line saying what was done
        (None when nothing was, and there is nothing new to say). Raises StartFailed when it
        could not be started."""
        now = time.monotonic()
        if now - self._last_start < SPAWN_RETRY_S:
            return None
        self._last_start = now
        try:
            os.makedirs(os.path.dirname(self.socket_path) or ".", mode=0o700, exist_ok=True)
            fd = os.open(lock_path(self.socket_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StartFailed(f"could not start the daemon: cannot take its start lock {lock_path(self.socket_path)} "
                              f"({_where(exc)}); check [daemon] socket in {self.config}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return None  # a daemon holds it, or another shim is starting one: wait for the socket
                raise
            if socket_answers(self.socket_path):
                return None  # one came up between our probe and the lock
            return self._spawn(fd, why)
        except OSError as exc:
            raise StartFailed(f"could not start the daemon ({' '.join(self.argv)}): {_where(exc)}") from exc
        finally:
            os.close(fd)  # the daemon keeps its own copy, and with it the lock

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", "toolatlas", "serve", "--config", self.config]

    def _spawn(self, lock_fd: int, why: OSError | None) -> str:
        import subprocess  # here: ~10 ms the shim does not spend unless it starts a daemon

        reason = f" ({why.strerror or why})" if why is not None else ""
        try:
            os.makedirs(os.path.dirname(self.log), mode=0o700, exist_ok=True)
            log = open(self.log, "ab")
        except OSError as exc:
            raise StartFailed(f"could not start the daemon: cannot write its log {self.log} ({_where(exc)}); "
                              f"check [daemon] state_dir in {self.config}") from exc
        with log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- {stamp} toolatlas shim (pid {os.getpid()}) starts the daemon: nothing answered on "
                      f"{self.socket_path}{reason}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                pass_fds=(lock_fd,), env=dict(os.environ, PYTHONUNBUFFERED="1", **{LOG_MAX_ENV: str(LOG_MAX_BYTES)}),
            )
        return f"started the daemon (pid {self.proc.pid}, config {self.config}); its log: {self.log}"

    def exited(self) -> int | None:
        """The exit status of the daemon this shim started, once it has exited (reaped here;
        reported once), else None."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is not None:
            self.proc = None
        return code


def _where(exc: OSError) -> str:
    """`PATH: reason` of an OSError (the path the call failed on may be a parent folder)."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason
