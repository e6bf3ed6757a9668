"""A second daemon on a served socket, or on a busy metrics port: one line, non-zero, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import Daemon
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _serve(config: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "daemon"))
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "toolatlas", "serve", "--config", str(config)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def _one_clear_line(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("toolatlas:")]
    assert len(errors) == 1, done.stderr
    assert needle in errors[0], done.stderr


def test_second_daemon_on_a_live_socket_refuses_in_one_line(tmp_path: Path) -> None:
    with Daemon(tmp_path, "") as first:
        done = _serve(first.config)
        _one_clear_line(done, first.socket)
        assert first.status()["index"]["ready"] is True  # the first one is untouched


def test_busy_metrics_port_refuses_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", port))
        busy.listen()
        d = Daemon(tmp_path, "", daemon_extra=f'metrics_addr = "127.0.0.1:{port}"\n')
        done = _serve(d.config)
    _one_clear_line(done, f"127.0.0.1:{port}")
    assert not os.path.exists(d.socket) or not _listening(d.socket)


def test_stale_socket_file_is_taken_over(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "")
    Path(d.socket).parent.mkdir(parents=True, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(d.socket)
    stale.close()  # the file stays, nobody listens
    with d:
        assert d.status()["index"]["ready"] is True


def _listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as c:
        try:
            c.connect(path)
        except OSError:
            return False
    return True
