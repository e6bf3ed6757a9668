"""Ctrl-C to the whole process group: a clean exit, no traceback, no socket file left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.daemon import Daemon

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
