"""A second daemon on a served socket, or on a busy metrics port: one line, non-zero, no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.daemon import Daemon
from tests.support.ports import free_port
from tests.support.processes import pid_alive

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
        # A stdio upstream the CLI starts before the daemon's imports (upstream/children.py):
        # the failed start must not leave it behind.
        marker = f"toolatlas-early-child-{os.getpid()}-{port}"
        sleeper = json.dumps(["-c", "import time; time.sleep(600)", marker])
        upstream = f'[[upstream]]\nname = "sleeper"\ntransport = "stdio"\ncommand = "{sys.executable}"\nargs = {sleeper}\n'
        d = Daemon(tmp_path, upstream, daemon_extra=f'metrics_addr = "127.0.0.1:{port}"\n')
        done = _serve(d.config)
    _one_clear_line(done, f"127.0.0.1:{port}")
    assert not os.path.exists(d.socket) or not _listening(d.socket)
    deadline = time.monotonic() + 10
    while _running_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running_with(marker), "the early-started upstream outlived the failed start"


def test_a_socket_whose_folder_cannot_be_made_refuses_in_one_line(tmp_path: Path) -> None:
    """A [daemon] socket under a regular file: the folder cannot be made. serve died with a
    FileExistsError traceback (exit 1); now it is one line naming the socket and why, exit 78."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    d = Daemon(tmp_path, "")
    text = d.config.read_text()
    assert f'socket = "{d.socket}"' in text
    d.config.write_text(text.replace(f'socket = "{d.socket}"', f'socket = "{blocker / "t.sock"}"'))
    done = _serve(d.config)
    assert done.returncode == 78, done.stderr
    _one_clear_line(done, f"cannot listen on the socket {str(blocker / 't.sock')!r}: {blocker} is not a folder")


def _running_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and pid_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


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
