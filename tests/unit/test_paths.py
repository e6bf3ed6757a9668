"""One socket-path resolver (toolatlas.paths) and one HOST:PORT parser (toolatlas.config)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolatlas.config import host_port, load, metrics_address, parse
from toolatlas.errors import ConfigError
from toolatlas.paths import client_socket, default_socket_path


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RUNDIR", str(tmp_path / "rundir"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    monkeypatch.delenv("TOOLATLAS_SOCKET", raising=False)
    monkeypatch.delenv("TOOLATLAS_CONFIG", raising=False)
    return monkeypatch


def _config(tmp_path: Path, socket: str | None) -> Path:
    f = tmp_path / "conf" / "c.toml"
    f.parent.mkdir(exist_ok=True)
    body = "[daemon]\nmetrics_addr = ''\n" + (f"socket = {socket!r}\n" if socket is not None else "")
    # A value only the daemon's environment has: the CLI must still find the socket.
    f.write_text(body + "[[upstream]]\nname = 'w'\ntransport = 'http'\nurl = 'http://x/${DAEMON_ONLY}'\n")
    return f


@pytest.mark.parametrize("socket", [
    "~/run/t.sock", "${RUNDIR}/t.sock", "rel/t.sock", "../up/t.sock", "/abs/t.sock", "$RUNDIR/t.sock", "", None,
])
def test_the_cli_finds_the_socket_the_daemon_listens_on(env: pytest.MonkeyPatch, tmp_path: Path, socket: str | None) -> None:
    f = _config(tmp_path, socket)
    env.setenv("DAEMON_ONLY", "x")
    daemon_side = load(f).daemon.socket
    env.delenv("DAEMON_ONLY")
    assert client_socket(None, str(f)) == daemon_side
    env.setenv("TOOLATLAS_CONFIG", str(f))
    assert client_socket(None) == daemon_side


def test_expected_paths(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert client_socket(None, str(_config(tmp_path, "~/run/t.sock"))) == str(tmp_path / "home" / "run" / "t.sock")
    assert client_socket(None, str(_config(tmp_path, "${RUNDIR}/t.sock"))) == str(tmp_path / "rundir" / "t.sock")
    assert client_socket(None, str(_config(tmp_path, None))) == default_socket_path()


def test_precedence_flag_env_config_default(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = str(_config(tmp_path, "/from/config.sock"))
    env.setenv("TOOLATLAS_SOCKET", "/from/env.sock")
    assert client_socket("/from/flag.sock", f) == "/from/flag.sock"
    assert client_socket(None, f) == "/from/env.sock"
    env.delenv("TOOLATLAS_SOCKET")
    assert client_socket(None, f) == "/from/config.sock"
    env.setenv("TOOLATLAS_CONFIG", str(tmp_path / "missing.toml"))  # set for every shell, not there (yet)
    assert client_socket(None) == default_socket_path()


def test_a_config_flag_naming_no_file_is_an_error_not_the_default_socket(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--config` with a typo must not send the command to the default socket (another daemon,
    or an error about a socket the user never named)."""
    missing = str(tmp_path / "confg.toml")
    with pytest.raises(ConfigError, match="confg.toml"):
        client_socket(None, missing)
    for argv in (["status"], ["upstream", "list"], ["reload"]):
        r = subprocess.run([sys.executable, "-m", "toolatlas", *argv, "--config", missing],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 78 and missing in r.stderr, (argv, r.returncode, r.stderr)
        assert default_socket_path() not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_unset_variable_or_bad_toml_is_a_config_error(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"daemon.socket: environment variable \$\{NOPE\} is not set"):
        client_socket(None, str(_config(tmp_path, "${NOPE}/t.sock")))
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\n")
    with pytest.raises(ConfigError, match="bad.toml"):
        client_socket(None, str(bad))
    binary = tmp_path / "binary.toml"  # what `--config` names by mistake: a key, an archive
    binary.write_bytes(b"\xb2\x00\xff[daemon]\n")
    with pytest.raises(ConfigError, match=r"binary.toml.*not UTF-8 text"):
        client_socket(None, str(binary))
    for argv in (["status"], ["doctor"]):  # one line and exit 78 (doctor: its failed check), no traceback
        r = subprocess.run([sys.executable, "-m", "toolatlas", *argv, "--config", str(binary)],
                           capture_output=True, text=True, timeout=60)
        assert "Traceback" not in r.stderr and r.returncode in (1, 78), (argv, r.returncode, r.stderr)


def test_a_folder_or_a_nul_in_the_socket_is_one_plain_line(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A folder given as --config read "[Errno 22] not a regular file (a directory): '...'"; a NUL
    in its [daemon] socket was a ValueError traceback (status, search, call, shim --config)."""
    with pytest.raises(ConfigError) as info:
        client_socket(None, str(tmp_path))
    assert str(info.value) == f"cannot read the socket from {str(tmp_path)!r}: not a regular file (a directory)"
    nul = tmp_path / "nul.toml"
    nul.write_text('[daemon]\nsocket = "run/a\\u0000.sock"\n')
    for argv in (["status"], ["shim"]):
        r = subprocess.run([sys.executable, "-m", "toolatlas", *argv, "--config", str(nul)],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 78, (argv, r.stderr)
        assert r.stderr.splitlines() == [f"toolatlas: config error: {nul}: daemon.socket: contains a NUL character "
                                         "(\\u0000), which no path, command or value can hold; remove it"], r.stderr


def test_the_cli_command_uses_the_expanded_socket(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`toolatlas status --config C` with `socket = "~/..."` looks where the daemon listens."""
    f = _config(tmp_path, "~/run/t.sock")
    r = subprocess.run([sys.executable, "-m", "toolatlas", "status", "--config", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 69, r.stderr
    assert f"cannot reach the toolatlas daemon at {tmp_path / 'home' / 'run' / 't.sock'}:" in r.stderr


@pytest.mark.parametrize(("addr", "want"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    (":9464", ("127.0.0.1", 9464)),
    ("[::1]:0", ("::1", 0)),
    ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ("localhost:80", ("localhost", 80)),
])
def test_host_port(addr: str, want: tuple[str, int]) -> None:
    assert host_port(addr, key="[daemon] metrics_addr") == want


@pytest.mark.parametrize("addr", ["nope", "127.0.0.1", "h:65536", "h:-1", "h:", "h:８０", "h:1e3"])
def test_host_port_refuses(addr: str) -> None:
    with pytest.raises(ConfigError, match=r"^src: \[x\] y must be HOST:PORT, got"):
        host_port(addr, key="[x] y", source="src")


def test_http_listen_needs_a_host_and_metrics_does_not() -> None:
    assert metrics_address(parse("[daemon]\nmetrics_addr = ':9464'\n")) == ("127.0.0.1", 9464)
    with pytest.raises(ConfigError, match=r"\[http\] listen must be HOST:PORT, got ':8765'"):
        parse('[http]\nlisten = ":8765"\nanonymous = "dev"\n')
