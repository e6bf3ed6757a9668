"""`toolatlas doctor` against real setups (a healthy daemon is checked in test_adopt.py, on an
adopted config), `check-config`'s warning for a command that is not found, and `--k`'s range."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import Daemon, stdio_testserver

GHOST = "toolatlas-test-no-such-command"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolatlas", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=60, check=False)


def test_doctor_names_a_missing_command_and_the_upstream_it_breaks(tmp_path: Path) -> None:
    ghost = f'[[upstream]]\nname = "ghost"\ntransport = "stdio"\ncommand = "{GHOST}"\n'
    with Daemon(tmp_path, stdio_testserver("s") + ghost) as d:
        d.wait_for(lambda: {s["name"]: s["state"] for s in d.status()["servers"]} == {"s": "ready", "ghost": "degraded"},
                   60, "s ready and ghost degraded")
        r = _run("doctor", "--config", str(d.config))
    assert r.returncode == 1, r.stdout
    lines = r.stdout.splitlines()
    assert f"FAIL  command: upstream 'ghost': command '{GHOST}' is not found on PATH: install it, or give its " \
           "absolute path as `command` in the config" in lines
    assert any(line.startswith("ok    upstream s: ready, ") and line.endswith(" tools over stdio") for line in lines)
    assert any(line.startswith("FAIL  upstream ghost: degraded: ") for line in lines), r.stdout
    assert f"ok    daemon: answers at {d.socket}" in lines and lines[-1] == "2 problem(s) found"

    warned = _run("check-config", str(d.config))
    assert warned.returncode == 0 and "OK" in warned.stdout
    assert f"warning: upstream 'ghost': command '{GHOST}' is not found on PATH" in warned.stderr


def test_doctor_fails_when_no_daemon_answers(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "none.sock"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\nmetrics_addr = ""\n'
                   f'[search]\nembedder = "onnx"\n{stdio_testserver("s")}')
    r = _run("doctor", "--config", str(cfg))
    assert r.returncode == 1, r.stdout
    lines = r.stdout.splitlines()
    assert f"ok    config: {cfg} is valid (1 upstreams)" in lines
    assert "ok    commands: all 1 stdio upstream commands found" in lines
    assert f"ok    state dir: {tmp_path / 'state'} does not exist yet; the daemon will create it" in lines
    assert any(line.startswith("WARN  model: no ONNX export at ") for line in lines)  # a first start makes it
    daemon = [line for line in lines if line.startswith("FAIL  daemon: ")]
    assert daemon and f"no answer at {sock} (No such file or directory); start it with `toolatlas serve " \
        f"--config {cfg}`" in daemon[0]
    assert lines[-1] == "1 problem(s) found"


def test_doctor_is_import_light(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "none.sock"}"\nstate_dir = "{tmp_path / "state"}"\n')
    code = ("import sys, contextlib, io; from toolatlas.doctor_cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()): main(['--config', {str(cfg)!r}])\n"
            "print(' '.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert not {"numpy", "onnxruntime", "torch", "mcp", "anyio", "tokenizers"} & set(out.split())


def test_doctor_reports_an_invalid_config_and_an_unwritable_state_dir(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[daemon]\nsokcet = "x"\n')
    r = _run("doctor", "--config", str(cfg))
    assert r.returncode == 1
    assert "FAIL  config: " in r.stdout and "unknown key 'sokcet' in [daemon]" in r.stdout
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{blocker / "state"}"\n')
    r = _run("doctor", "--config", str(cfg))
    assert r.returncode == 1 and f"FAIL  state dir: {blocker} is not a folder" in r.stdout


def test_search_k_outside_its_range_is_a_usage_error(tmp_path: Path) -> None:
    for k in ("0", "21", "many"):
        r = _run("search", "anything", "--k", k, "--socket", str(tmp_path / "none.sock"))
        assert r.returncode == 2 and "argument --k: must be" in r.stderr and "from 1 to 20" in r.stderr, r.stderr
