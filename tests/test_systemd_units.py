"""The shipped systemd units: required directives, `systemd-analyze verify`, security review.

`systemd-analyze` comes from Debian's `systemd` package; when it is missing and we are root
with apt-get, the fixture installs it (as the issue asks); only if that fails do the
verify tests skip, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "systemd"
INSTALLED_BIN = "/usr/local/bin/toolatlas"
USER_BIN = "%h/.local/bin/toolatlas"


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections -> (key, value) in order; systemd allows repeated keys, so no dict per section."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    got = values(unit, section, key)
    assert len(got) == 1, f"[{section}] {key}: expected one value, got {got}"
    return got[0]


def test_system_service_directives() -> None:
    u = parse_unit(UNITS / "toolatlas.service")
    s = "Service"
    assert one(u, s, "Type") == "notify"
    assert one(u, s, "NotifyAccess") == "main"
    assert re.fullmatch(r"\d+s?", one(u, s, "WatchdogSec"))
    assert one(u, s, "ExecStart") == f"{INSTALLED_BIN} serve --config /etc/toolatlas/config.toml"
    assert one(u, s, "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(u, s, "User") == "toolatlas" or values(u, s, "DynamicUser") == ["yes"]
    for key in ("RuntimeDirectory", "StateDirectory", "ConfigurationDirectory"):
        assert one(u, s, key) == "toolatlas"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert one(u, s, key) == "yes", key
    assert one(u, s, "ProtectSystem") == "strict"
    assert one(u, s, "RestrictAddressFamilies").split() == ["AF_UNIX", "AF_INET", "AF_INET6"]
    assert "@system-service" in values(u, s, "SystemCallFilter")
    # Stdio upstreams must still run: node's JIT needs W+X pages, and a blocked syscall must
    # fail with an errno rather than kill the child.
    assert values(u, s, "MemoryDenyWriteExecute") in ([], ["no"])
    assert one(u, s, "SystemCallErrorNumber") == "EPERM"
    # Writable home and caches for npx/uvx under ProtectSystem=strict.
    env = dict(v.split("=", 1) for v in values(u, s, "Environment"))
    assert env["HOME"] == "/var/lib/toolatlas"
    assert env["npm_config_cache"].startswith("/var/cache/toolatlas")
    assert one(u, s, "CacheDirectory") == "toolatlas"
    # The socket unit's socket survives service restarts.
    assert one(u, s, "RuntimeDirectoryPreserve") == "yes"
    assert one(u, "Install", "WantedBy") == "multi-user.target"


def test_socket_unit_directives() -> None:
    u = parse_unit(UNITS / "toolatlas.socket")
    assert one(u, "Socket", "ListenStream") == "/run/toolatlas/toolatlas.sock"
    assert one(u, "Socket", "SocketMode") == "0660"
    assert one(u, "Socket", "SocketGroup") == "toolatlas"
    assert one(u, "Socket", "Service") == "toolatlas.service"
    # The group exists before the first start because the user is static (sysusers.d).
    sysusers = (UNITS / "sysusers.d" / "toolatlas.conf").read_text()
    assert re.search(r"^u toolatlas ", sysusers, re.M)


def test_user_units_directives() -> None:
    u = parse_unit(UNITS / "user" / "toolatlas.service")
    s = "Service"
    assert one(u, s, "Type") == "notify"
    assert one(u, s, "ExecStart") == f"{USER_BIN} serve --config %E/toolatlas/config.toml"
    assert values(u, s, "User") == [] and values(u, s, "DynamicUser") == []
    assert one(u, s, "RuntimeDirectory") == "toolatlas"
    assert one(u, "Install", "WantedBy") == "default.target"
    sock = parse_unit(UNITS / "user" / "toolatlas.socket")
    assert one(sock, "Socket", "ListenStream") == "%t/toolatlas/toolatlas.sock"
    assert one(sock, "Socket", "SocketMode") == "0600"


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("systemd-analyze missing and cannot install Debian's systemd package (not root/apt)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "systemd"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0 and cmd[1] == "install":
            pytest.skip(f"systemd-analyze missing; apt-get install systemd failed: {proc.stderr[-300:]}")
    found = shutil.which("systemd-analyze")
    if not found:
        pytest.skip("systemd-analyze still missing after installing Debian's systemd package")
    return found


def _staged(tmp_path: Path, names: list[str], replace: tuple[str, str]) -> list[Path]:
    """Copies of the units with ExecStart pointing at this venv's toolatlas (verify checks it exists)."""
    binary = Path(sys.executable).parent / "toolatlas"
    assert binary.exists(), "the toolatlas console script is not installed in this venv"
    out = []
    for name in names:
        dst = tmp_path / Path(name).name
        dst.write_text((UNITS / name).read_text().replace(replace[0], str(binary)))
        out.append(dst)
    return out


def _verify(analyze: str, units: list[Path], *, user: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [analyze] + (["--user"] if user else []) + ["verify", "--man=no"] + [str(u) for u in units]
    env = dict(os.environ, XDG_RUNTIME_DIR=str(units[0].parent), SYSTEMD_LOG_COLOR="0")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_systemd_analyze_verify_system_units(systemd_analyze: str, tmp_path: Path) -> None:
    units = _staged(tmp_path, ["toolatlas.service", "toolatlas.socket"], (INSTALLED_BIN, ""))
    proc = _verify(systemd_analyze, units)
    # verify prints unknown keys and bad values as warnings with exit 0: demand silence.
    assert proc.returncode == 0 and proc.stderr.strip() == "" and proc.stdout.strip() == "", proc.stderr


def test_systemd_analyze_verify_user_units(systemd_analyze: str, tmp_path: Path) -> None:
    units = _staged(tmp_path, ["user/toolatlas.service", "user/toolatlas.socket"], (USER_BIN, ""))
    proc = _verify(systemd_analyze, units, user=True)
    assert proc.returncode == 0 and proc.stderr.strip() == "" and proc.stdout.strip() == "", proc.stderr


def test_verify_catches_a_broken_unit(systemd_analyze: str, tmp_path: Path) -> None:
    """Control: the same check reports a typo, so a silent verify above means something."""
    (unit,) = _staged(tmp_path, ["toolatlas.service"], (INSTALLED_BIN, ""))
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"))
    proc = _verify(systemd_analyze, [unit])
    assert "ProtectSytem" in proc.stderr


def test_security_exposure_is_low(systemd_analyze: str, tmp_path: Path) -> None:
    (unit,) = _staged(tmp_path, ["toolatlas.service"], (INSTALLED_BIN, ""))
    proc = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True, text=True, timeout=120,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    assert m, proc.stdout + proc.stderr
    # systemd rates 0-10 (10 = unprotected); a plain unit with no hardening scores 9.6.
    assert float(m.group(1)) <= 2.0, proc.stdout


def test_sysusers_entry_is_valid(systemd_analyze: str, tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    if sysusers is None:
        pytest.skip("systemd-sysusers not installed (Debian package systemd)")
    conf = UNITS / "sysusers.d" / "toolatlas.conf"
    proc = subprocess.run([sysusers, "--dry-run", f"--root={tmp_path}", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Creating user 'toolatlas'" in proc.stderr + proc.stdout


def test_shipped_system_config_matches_the_units() -> None:
    from toolatlas.config import load

    cfg = load(str(UNITS / "config.toml"))
    sock = parse_unit(UNITS / "toolatlas.socket")
    assert cfg.daemon.socket == one(sock, "Socket", "ListenStream")
    assert cfg.daemon.state_dir == "/var/lib/toolatlas"  # StateDirectory=toolatlas
    svc = parse_unit(UNITS / "toolatlas.service")
    assert "/etc/toolatlas/config.toml" in one(svc, "Service", "ExecStart")  # ConfigurationDirectory
