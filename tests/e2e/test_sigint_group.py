"""Ctrl-C to the whole process group: a clean exit, no traceback, no socket file left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.processes import descendants, kill_all, wait_gone

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("second", [None, signal.SIGINT, signal.SIGTERM])
def test_sigint_to_the_group_ends_cleanly(tmp_path: Path, second: signal.Signals | None) -> None:
    d = Daemon(tmp_path, "")
    log = tmp_path / "out.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "daemon"), PYTHONUNBUFFERED="1")
    env.pop("NOTIFY_SOCKET", None)
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "toolatlas", "serve", "--config", str(d.config)],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if d.status()["index"]["ready"]:
                    break
            except (OSError, ConnectionError, KeyError, ValueError):
                time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        if second is not None:
            while b"draining" not in log.read_bytes() and proc.poll() is None and time.monotonic() < deadline + 60:
                time.sleep(0.01)
            if proc.poll() is None:
                os.killpg(proc.pid, second)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert code == 0, out
    assert "Traceback" not in out, out
    assert not os.path.exists(d.socket), out


def test_ctrl_c_while_the_daemon_imports_is_a_quiet_exit(tmp_path: Path) -> None:
    """A Ctrl-C in serve's first seconds (its imports, before it takes SIGINT over: a wrong
    config noticed at once) printed a KeyboardInterrupt traceback from deep inside an import.
    It is exit 130 without one, and the stdio child started early is stopped."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    log = tmp_path / "out.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "daemon"), PYTHONUNBUFFERED="1")
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "toolatlas", "serve", "--config", str(d.config)],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not kids and proc.poll() is None and time.monotonic() < deadline:
            kids = descendants(proc.pid)  # the early child: the daemon is importing now
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_all(kids)
    out = log.read_text()
    assert kids and code in (0, 130), (code, out)  # 0: the daemon had taken SIGINT over after all
    assert "Traceback" not in out, out
    assert wait_gone(kids, timeout=10) == [], out
