"""A process forked by the suite's fork server (servers/forkserver.py) for this process, held as
a `subprocess.Popen` would be: its real pid, `poll`, `wait`, `send_signal`, `kill`,
`returncode`. It is not this process's child; the fork server reaps it and writes its wait
status down the connection this object holds. Closing that connection (this object collected,
this process gone) makes the fork server SIGKILL it, as a launcher's end does."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.support.servers.forkserver import send_request


class Forked:
    def __init__(self, sock_path: str, script: str, argv: list[str], *, env: Mapping[str, str],
                 cwd: Path | str | None, stdin: int, stdout: int, stderr: int) -> None:
        """Ask the fork server at `sock_path` for a child running `script` (forkserver.DAEMON for
        a daemon) with `argv`, `env` and folder `cwd` (this process's when None) on the three
        file descriptors given. Raises OSError when the fork server does not answer with a pid."""
        self.args = [script, *argv]
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.settimeout(30)
            self._conn.connect(sock_path)
            send_request(self._conn, script, argv, env, str(cwd) if cwd is not None else os.getcwd(),
                         (stdin, stdout, stderr))
            first = self._line()
            if not first.startswith(b"P "):
                raise OSError(f"the fork server answered {first!r}, not a pid")
            self.pid = int(first[2:])
        except BaseException:
            self._conn.close()
            raise
        self._conn.settimeout(None)

    def _line(self) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            chunk = self._conn.recv(1)
            if not chunk:
                break
            line += chunk
        return line

    def poll(self) -> int | None:
        if self.returncode is None:
            readable, _, _ = select.select([self._conn], [], [], 0)
            if readable:
                self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            readable, _, _ = select.select([self._conn], [], [], timeout)
            if not readable:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._finish()
        assert self.returncode is not None
        return self.returncode

    def _finish(self) -> None:
        line = self._line()
        self._conn.close()
        # No status line: the fork server itself went, and its children with it (PDEATHSIG KILL).
        status = int(line[2:]) if line.startswith(b"S ") else signal.SIGKILL
        self.returncode = os.waitstatus_to_exitcode(status)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reused
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
