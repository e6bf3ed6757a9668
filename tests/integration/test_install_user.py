"""`toolatlas install --user` (#16 item 3): the units it writes under $XDG_CONFIG_HOME pass
`systemd-analyze --user verify`, run this installation against the given config, listen
where that config's daemon listens, and are the units shipped in systemd/user/ but for those
two lines. In a container with no user manager it says what to run and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_systemd_units import UNITS, _verify, one, parse_unit, systemd_analyze  # noqa: F401
from tests.support.daemon import Daemon, stdio_testserver


def install(xdg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CONFIG_HOME=str(xdg))
    return subprocess.run([sys.executable, "-m", "toolatlas", "install", "--user", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture
def config(tmp_path: Path) -> Daemon:
    """A valid config (not started) whose socket is in tmp_path."""
    (tmp_path / "d").mkdir()
    return Daemon(tmp_path / "d", stdio_testserver("alpha"))


def test_install_user_writes_verified_units(tmp_path: Path, config: Daemon, systemd_analyze: str) -> None:
    xdg = tmp_path / "xdg"
    r = install(xdg, "--config", str(config.config))
    assert r.returncode == 0, r.stderr
    folder = xdg / "systemd" / "user"
    units = [folder / "toolatlas.service", folder / "toolatlas.socket"]
    for unit in units:
        assert f"wrote {unit}" in r.stdout
    service, sock = parse_unit(units[0]), parse_unit(units[1])
    exe, *rest = one(service, "Service", "ExecStart").split()
    assert os.access(exe, os.X_OK) and rest == ["serve", "--config", str(config.config)]
    assert one(sock, "Socket", "ListenStream") == config.socket
    proc = _verify(systemd_analyze, units, user=True)
    assert proc.returncode == 0 and proc.stderr.strip() == "" and proc.stdout.strip() == "", proc.stderr
    # Enabled where a user manager answers; otherwise the commands to run, and no failure.
    if "not reachable" in r.stdout:
        assert "systemctl --user daemon-reload" in r.stdout
        assert "systemctl --user enable --now toolatlas.socket" in r.stdout
    else:
        assert "ran: systemctl --user enable --now toolatlas.socket" in r.stdout


def test_installed_units_are_the_shipped_ones(tmp_path: Path, config: Daemon) -> None:
    """Only ExecStart and ListenStream (and the comments) differ from systemd/user/."""
    xdg = tmp_path / "xdg"
    assert install(xdg, "--config", str(config.config)).returncode == 0
    for name, differs in (("toolatlas.service", "ExecStart"), ("toolatlas.socket", "ListenStream")):
        shipped, written = parse_unit(UNITS / "user" / name), parse_unit(xdg / "systemd" / "user" / name)
        for section in shipped:
            want = [(k, v) for k, v in shipped[section] if k != differs]
            assert [(k, v) for k, v in written[section] if k != differs] == want, (name, section)


def test_dry_run_changes_nothing(tmp_path: Path, config: Daemon) -> None:
    xdg = tmp_path / "xdg"
    r = install(xdg, "--config", str(config.config), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "[Service]" in r.stdout and "[Socket]" in r.stdout and "enable --now toolatlas.socket" in r.stdout
    assert not xdg.exists()


def test_a_config_the_daemon_refuses_is_refused_now(tmp_path: Path, config: Daemon) -> None:
    config.config.write_text(config.config.read_text() + "\n[no_such_table]\nx = 1\n")
    r = install(tmp_path / "xdg", "--config", str(config.config))
    assert r.returncode == 78 and "no_such_table" in r.stderr
    assert not (tmp_path / "xdg").exists()


def test_variables_from_the_units_environment_file_count_when_checking(tmp_path: Path, config: Daemon) -> None:
    """The README keeps the config's ${VAR}s in ~/.config/toolatlas/environment (the service
    unit's EnvironmentFile), out of the shell: install checks the config with them."""
    config.config.write_text(config.config.read_text() + '\n[[upstream]]\nname = "web"\ntransport = "http"\n'
                             'url = "http://127.0.0.1:9/mcp"\nheaders = { Authorization = "Bearer ${TOOLATLAS_T_TOKEN}" }\n')
    xdg = tmp_path / "xdg"
    (xdg / "toolatlas").mkdir(parents=True)
    (xdg / "toolatlas" / "environment").write_text("# secrets for toolatlas\nTOOLATLAS_T_TOKEN='s3cret-value'\n")
    env = {k: v for k, v in os.environ.items() if k != "TOOLATLAS_T_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "toolatlas", "install", "--user", "--config", str(config.config),
                        "--dry-run"], capture_output=True, text=True, timeout=120, env={**env, "XDG_CONFIG_HOME": str(xdg)})
    assert r.returncode == 0, r.stderr
    assert "[Service]" in r.stdout and "s3cret" not in r.stdout + r.stderr
    (xdg / "toolatlas" / "environment").unlink()
    r = subprocess.run([sys.executable, "-m", "toolatlas", "install", "--user", "--config", str(config.config),
                        "--dry-run"], capture_output=True, text=True, timeout=120, env={**env, "XDG_CONFIG_HOME": str(xdg)})
    assert r.returncode == 78 and "${TOOLATLAS_T_TOKEN} is not set" in r.stderr, r.stderr


def test_without_user_it_says_what_it_does(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "toolatlas", "install"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--user" in r.stderr
