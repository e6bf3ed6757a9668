"""`toolatlas upstream ...` and `toolatlas reload` against a socket that accepts but never
answers (a wedged or stopped daemon, something else listening): a clear error and exit 69
once the handshake wait runs out, as `status` does, not after the long wait meant for a
restart or a reload the daemon is working on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from toolatlas import admin_cli


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["upstream", "list"], ["upstream", "restart", "a"], ["reload"]])
def test_a_daemon_that_never_answers_the_handshake_is_an_error_soon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    path = str(tmp_path / "mute.sock")
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(path)
    mute.listen(8)  # connections wait in the backlog: accepted by the kernel, never read
    monkeypatch.setattr(admin_cli, "ANSWER_TIMEOUT_S", 5.0)  # what a command may take once the daemon answers
    monkeypatch.setattr(admin_cli, "HANDSHAKE_TIMEOUT_S", 0.5, raising=False)
    main = admin_cli.reload_main if argv[0] == "reload" else admin_cli.upstream_main
    try:
        code = main([*argv[1:], "--socket", path])
    finally:
        mute.close()
    err = capsys.readouterr().err
    assert code == 69, err
    assert f"the daemon at {path} accepted the connection but did not answer within 0.5 s" in err, err
    assert "Traceback" not in err
