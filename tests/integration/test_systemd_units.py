"""The shipped systemd units: required directives, `systemd-analyze verify`, security review,
and whether real stdio upstreams (node, python) and the embedding stack stay inside the
unit's system call filter (traced with strace, compared with the filter systemd builds).

`systemd-analyze` comes from Debian's `systemd` package; when it is missing and we are root
with apt-get, the fixture installs it (as the issue asks); only if that fails do the
verify tests skip, saying why.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

from tests.support.servers import testserver_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
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
    # A short runtime dir: the distribution's user units put sockets under it (gpg-agent's
    # %t/gnupg/S.gpg-agent.extra), and a deep pytest tmp path (an xdist worker's) passes the
    # 108-byte socket path limit, which verify reports as an error.
    with tempfile.TemporaryDirectory(prefix="ta-run-", dir="/tmp") as runtime:
        env = dict(os.environ, XDG_RUNTIME_DIR=runtime, SYSTEMD_LOG_COLOR="0")
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


# -- the seccomp filter vs what upstreams really call ------------------------------------------

NPM_BIN = ROOT / "tests" / "npm" / "node_modules" / ".bin"
MCP_SESSION = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "hi"}}},
]


@pytest.fixture(scope="module")
def strace(systemd_analyze: str) -> str:
    found = shutil.which("strace")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("strace missing and cannot install Debian's strace package (not root/apt)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "strace"],
                          capture_output=True, text=True, env=env, timeout=600)
    found = shutil.which("strace")
    if not found:
        pytest.skip(f"strace missing; apt-get install strace failed: {proc.stderr[-300:]}")
    return found


def unit_syscall_allowlist(analyze: str, unit: Path) -> set[str]:
    """The set of syscalls the unit's SystemCallFilter= lines allow, expanded by systemd itself."""

    @functools.cache
    def expand(item: str) -> frozenset[str]:
        if not item.startswith("@"):
            return frozenset({item})
        out = subprocess.run([analyze, "syscall-filter", item], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        names: set[str] = set()
        for line in out.stdout.splitlines()[1:]:
            tok = line.strip()
            if tok and not tok.startswith("#"):
                names |= expand(tok)
        return frozenset(names)

    allowed: set[str] = set()
    for value in values(parse_unit(unit), "Service", "SystemCallFilter"):
        deny = value.startswith("~")
        items = {n for tok in value.lstrip("~").split() for n in expand(tok)}
        if deny:
            allowed -= items
        else:
            allowed |= items
    assert allowed, "the unit has no SystemCallFilter allow list"
    return allowed


def traced_syscalls(trace: Path) -> set[str]:
    names = set()
    for line in trace.read_text(errors="replace").splitlines():
        m = re.match(r"^\d+\s+([a-z0-9_]+)\(", line)
        if m:
            names.add(m.group(1))
    return names


def run_traced_mcp_session(strace: str, cmd: list[str], trace: Path) -> dict[int, dict]:
    """Run a stdio MCP server under strace, do initialize/tools/list/tools/call, close stdin."""
    # A session of its own: killing strace alone would leave a traced server running.
    proc = subprocess.Popen([strace, "-f", "-qq", "-o", str(trace), *cmd], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    replies: dict[int, dict] = {}
    try:
        for msg in MCP_SESSION:
            proc.stdin.write(json.dumps(msg) + "\n")
            proc.stdin.flush()
            if "id" not in msg:
                continue
            while msg["id"] not in replies:  # bounded by the timeout in the finally clause
                line = proc.stdout.readline()
                if not line:
                    break
                reply = json.loads(line)
                if "id" in reply:
                    replies[reply["id"]] = reply
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # a slow exit does not matter here: the session above is traced already
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the server too, if it hangs on exit
        proc.wait()
        proc.stdout.close()
    return replies


def socket_families(trace: Path) -> set[str]:
    return set(re.findall(r"\bsocket\((AF_[A-Z0-9]+)", trace.read_text(errors="replace")))


def _assert_within_filter(analyze: str, used: set[str], trace: Path | None = None) -> None:
    if trace is not None:
        families = one(parse_unit(UNITS / "toolatlas.service"), "Service", "RestrictAddressFamilies").split()
        assert socket_families(trace) <= set(families), socket_families(trace)
    allowed = unit_syscall_allowlist(analyze, UNITS / "toolatlas.service")
    outside = used - allowed
    if os.geteuid() == 0:
        # SQLite (inside onnxruntime, npm) fchown()s its journal only when running as root;
        # the service runs as User=toolatlas, where it never does.
        outside -= {"fchown", "fchownat", "chown", "lchown"}
    assert not outside, f"syscalls the unit would refuse with EPERM: {sorted(outside)}"


def test_syscall_filter_allows_a_node_stdio_upstream(systemd_analyze: str, strace: str, tmp_path: Path) -> None:
    server = NPM_BIN / "mcp-server-everything"
    if not server.exists():
        pytest.skip("npm test servers not installed (make npm)")
    trace = tmp_path / "node.trace"
    replies = run_traced_mcp_session(strace, [str(server), "stdio"], trace)
    assert "Echo: hi" in json.dumps(replies[3]["result"])
    used = traced_syscalls(trace)
    assert len(used) > 30 and used & {"epoll_wait", "epoll_pwait"}
    _assert_within_filter(systemd_analyze, used, trace)


def test_syscall_filter_allows_a_python_stdio_upstream(systemd_analyze: str, strace: str, tmp_path: Path) -> None:
    trace = tmp_path / "python.trace"
    replies = run_traced_mcp_session(
        strace, [sys.executable, *testserver_args()], trace
    )
    assert "Echo: hi" in json.dumps(replies[3]["result"])
    _assert_within_filter(systemd_analyze, traced_syscalls(trace), trace)


@pytest.mark.slow
def test_syscall_filter_allows_the_embedding_stack(systemd_analyze: str, strace: str, tmp_path: Path) -> None:
    """The daemon's heaviest code path: ONNX export in a torch subprocess, then onnxruntime."""
    trace = tmp_path / "embed.trace"
    code = (
        "import sys; from pathlib import Path; from toolatlas.retrieval.embed import get_embedder;"
        "e = get_embedder('onnx', Path(sys.argv[1])); print(e.embed(['read a file']).shape)"
    )
    proc = subprocess.Popen([strace, "-f", "-qq", "-o", str(trace), sys.executable, "-c", code, str(tmp_path / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache")))
    try:
        out, err = proc.communicate(timeout=500)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the export subprocess too, if still running
        proc.wait()
    assert proc.returncode == 0 and "(1, 384)" in out, err[-2000:]
    _assert_within_filter(systemd_analyze, traced_syscalls(trace), trace)
