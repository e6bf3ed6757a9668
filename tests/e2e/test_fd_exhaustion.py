"""Running out of file descriptors never kills the Unix listener: accept errors are logged
and retried, the socket file stays, and the daemon serves again once descriptors free up."""

from __future__ import annotations

import pytest
import os
import socket
import subprocess
from pathlib import Path

from tests.support.daemon import Daemon, stdio_testserver

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile


def test_accept_survives_fd_exhaustion(tmp_path: Path) -> None:
    d = Daemon(tmp_path, stdio_testserver("one"))
    with d:
        assert d.proc is not None
        pid = d.proc.pid
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        limit = in_use + 6
        hard = int(subprocess.run(["prlimit", f"--pid={pid}", "--nofile", "--raw", "--noheadings", "-o", "HARD"],
                                  check=True, capture_output=True, text=True).stdout.split()[0])
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={limit}:{hard}"], check=True)
        held: list[socket.socket] = []
        try:
            for _ in range(40):  # bounded: well past the few descriptors left
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(5)
                s.connect(d.socket)
                held.append(s)
            # the daemon has no descriptor left for them: accept fails, is logged and retried
            d.wait_for(lambda: "accept on" in d.log.read_text(errors="replace"), 30, "accept failure logged")
            assert os.path.exists(d.socket)
        finally:
            for s in held:
                s.close()
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={min(hard, 4096)}:{hard}"], check=True)
        # served again: a new client gets a real answer, and the socket file is still there
        st = d.wait_for(lambda: d.status(), 60, "status after the fd storm")
        assert st["servers"][0]["name"] == "one" and os.path.exists(d.socket)
        assert d.proc.poll() is None
