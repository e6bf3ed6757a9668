"""`toolatlas search|call|status` against a socket that accepts but never answers: a clear
error and exit 69 once the answer timeout runs out, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from toolatlas import cli


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["status"], ["search", "weather"], ["call", "one__echo"]])
def test_a_daemon_that_never_answers_is_an_error_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    path = str(tmp_path / "mute.sock")
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(path)
    mute.listen(8)  # connections wait in the backlog: accepted by the kernel, never read
    monkeypatch.setattr(cli, "ANSWER_TIMEOUT_S", 0.5)
    try:
        code = cli.main([*argv, "--socket", path])
    finally:
        mute.close()
    err = capsys.readouterr().err
    assert code == 69, err
    assert f"the daemon at {path} accepted the connection but did not answer within 0.5 s" in err, err
