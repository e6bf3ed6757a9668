"""`toolatlas search|call|status` against a socket that accepts but never answers: a clear
error and exit 69 once the answer timeout runs out, never a traceback. `toolatlas upstream
...` and `toolatlas reload` likewise, once the handshake wait runs out (not after the long
wait meant for a restart or a reload the daemon is working on)."""

from __future__ import annotations

import contextlib
import gettext  # noqa: F401  # argparse's lazy imports, done before run_as drops to a user who cannot read them
import io
import locale  # noqa: F401
import os
import pwd
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolatlas.surface.rawclient  # noqa: F401  # imported by the commands; see gettext above
from tests.support.peers import run_as
from toolatlas import admin_cli, cli


@pytest.fixture
def mute(tmp_path: Path) -> Iterator[str]:
    """A socket path whose connections wait in the backlog: accepted by the kernel, never read."""
    path = str(tmp_path / "mute.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    try:
        yield path
    finally:
        sock.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["status"], ["search", "weather"], ["call", "one__echo"]])
def test_a_daemon_that_never_answers_is_an_error_not_a_traceback(
        mute: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    monkeypatch.setattr(cli, "ANSWER_TIMEOUT_S", 0.5)
    code = cli.main([*argv, "--socket", mute])
    err = capsys.readouterr().err
    assert code == 69, err
    assert f"the daemon at {mute} accepted the connection but did not answer within 0.5 s" in err, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["upstream", "list"], ["upstream", "restart", "a"], ["reload"]])
def test_a_daemon_that_never_answers_the_handshake_is_an_operator_error_soon(
        mute: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    monkeypatch.setattr(admin_cli, "ANSWER_TIMEOUT_S", 5.0)  # what a command may take once the daemon answers
    monkeypatch.setattr(admin_cli, "HANDSHAKE_TIMEOUT_S", 0.5, raising=False)
    code = cli.main([*argv, "--socket", mute])
    err = capsys.readouterr().err
    assert code == 69, err
    assert f"the daemon at {mute} accepted the connection but did not answer within 0.5 s" in err, err
    assert "Traceback" not in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["status"], ["search", "weather"], ["call", "one__echo"], ["reload"],
                                  ["upstream", "list"], ["stubs", "--out", "pkg"]])
@pytest.mark.parametrize("kind", ["a regular file", "a directory"])
def test_a_socket_path_that_is_not_a_socket_is_said_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], kind: str) -> None:
    """A config file or a folder given as --socket was "Connection refused. Is `toolatlas serve`
    running", after the wait meant for a daemon that is starting."""
    path = tmp_path / "toolatlas.toml"
    if kind == "a directory":
        path.mkdir()
    else:
        path.write_text("[daemon]\n")
    argv = [a if a != "pkg" else str(tmp_path / "pkg") for a in argv]
    code = cli.main([*argv, "--socket", str(path)])
    err = capsys.readouterr().err
    assert code == 69, err
    assert err.splitlines() == [f"toolatlas: {path} is {kind}, not a socket: point --socket, $TOOLATLAS_SOCKET or "
                                "the config's [daemon] socket at the daemon's socket"], err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["status"], ["reload"], ["upstream", "list"]])
def test_a_socket_path_too_long_for_a_socket_is_said_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """It read "AF_UNIX path too long. Is `toolatlas serve` running", after the wait meant for a
    daemon that is starting; no daemon can listen there (its config refuses such a socket)."""
    path = str(tmp_path / ("x" * 120) / "toolatlas.sock")
    code = cli.main([*argv, "--socket", path])
    err = capsys.readouterr().err
    assert code == 69, err
    assert err.splitlines() == [f"toolatlas: {path}: {len(path)} bytes long, and a Unix socket path holds at most 107, "
                                "so no daemon listens there: point --socket, $TOOLATLAS_SOCKET or the config's "
                                "[daemon] socket at a shorter one"], err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["status"], ["reload"]])
@pytest.mark.parametrize("closed", ["socket", "folder"])
def test_a_socket_closed_to_the_user_is_said_so(argv: list[str], closed: str) -> None:
    """A user not in the socket's group read "Permission denied. Is `toolatlas serve` running,
    and is this the right --socket?", after the wait meant for a daemon that is starting."""
    if os.geteuid() != 0:
        pytest.skip("a peer of another uid needs root to drop to it")
    folder = tempfile.mkdtemp(prefix="toolatlas-closed-")  # pytest's tmp_path is closed to other users
    path = os.path.join(folder, "toolatlas.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(8)
        os.chmod(path, 0o660)
        os.chmod(folder, 0o700 if closed == "folder" else 0o755)

        def command() -> Any:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = cli.main([*argv, "--socket", path])
            return [code, err.getvalue()]

        code, err = run_as(pwd.getpwnam("nobody"), command)
    finally:
        listener.close()
        shutil.rmtree(folder)
    assert code == 69, err
    why = ("a folder on its path is closed to this user" if closed == "folder"
           else "the socket (owner root, group root, mode 0660) is not open to this user")
    assert err.splitlines() == [f"toolatlas: {path}: permission denied: {why}; join its group, or have the daemon's "
                                "operator set [daemon] socket_mode or socket_group"], err
