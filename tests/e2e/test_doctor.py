"""`toolatlas doctor` against real setups (a healthy daemon is checked in test_adopt.py, on an
adopted config), `check-config`'s warning for a command that is not found, and `--k`'s range."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.peers import run_as
from tests.support.ports import free_port

from toolatlas import doctor_cli

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


def test_doctor_says_when_the_daemon_runs_the_config_as_it_was_before_an_edit(tmp_path: Path) -> None:
    """An upstream added to the file and one taken out, not reloaded: the daemon's answer
    lists neither the new one nor drops the old, and doctor said 'config valid (N upstreams)'
    and all ok, while the client saw none of the added server. Now each is a WARN line
    naming the upstream and `toolatlas reload`."""
    with Daemon(tmp_path, stdio_testserver("old")) as d:
        d.wait_for(lambda: [s["state"] for s in d.status()["servers"]] == ["ready"], 60, "old ready")
        d.config.write_text(d.config.read_text().replace('name = "old"', 'name = "new"'))
        r = _run("doctor", "--config", str(d.config))
    lines = r.stdout.splitlines()
    assert f"WARN  upstream new: in {d.config} but not run by the daemon: it runs the config as it was before an " \
           "edit (apply it with `toolatlas reload`), or your access rules hide it" in lines, r.stdout
    assert f"WARN  upstream old: run by the daemon but no longer in {d.config}: apply the edit with " \
           "`toolatlas reload`" in lines, r.stdout
    assert r.returncode == 0 and lines[-1] == "no problems found", r.stdout


def test_status_and_doctor_name_an_upstream_awaiting_approval(tmp_path: Path) -> None:
    """With require_approval an upstream is connected and listed but serves nothing until
    approved. `toolatlas status` showed it 'ready 5 tools' beside 'index: 0 searchable tools'
    and doctor said 'ok ... ready': neither named the approval the operator has to give (only
    the JSON's not_searchable_because did)."""
    with Daemon(tmp_path, stdio_testserver("s"), daemon_extra="require_approval = true") as d:
        d.wait_for(lambda: [s["state"] for s in d.status()["servers"]] == ["ready"], 60, "s ready")
        status = _run("status", "--socket", d.socket)
        doctor = _run("doctor", "--config", str(d.config))
    row = next(line for line in status.stdout.splitlines() if line.startswith("s "))
    assert row.endswith("(not searchable: awaiting approval: `toolatlas upstream approve s`)"), status.stdout
    assert any(line.startswith("WARN  upstream s: ready, ") and line.endswith(
        " tools, serving none: awaiting approval: `toolatlas upstream approve s`") for line in doctor.stdout.splitlines()), \
        doctor.stdout


def test_a_cwd_that_is_not_a_folder_is_found_before_the_daemon_fails_on_it(tmp_path: Path) -> None:
    """The daemon cannot start a stdio upstream whose `cwd` does not exist (FileNotFoundError
    naming the folder): check-config warns of it and doctor fails it, as for a missing command."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{tmp_path / "state"}"\nmetrics_addr = ""\n'
                   f'[search]\nembedder = "none"\n[[upstream]]\nname = "t"\ntransport = "stdio"\n'
                   f'command = "{sys.executable}"\ncwd = "{tmp_path / "gone"}"\n')
    warned = _run("check-config", str(cfg))
    assert warned.returncode == 0 and f"warning: upstream 't': cwd '{tmp_path / 'gone'}' is not a folder" in warned.stderr, \
        warned.stderr
    r = _run("doctor", "--config", str(cfg))
    assert f"FAIL  command: upstream 't': cwd '{tmp_path / 'gone'}' is not a folder: create it, or fix `cwd` in " \
           "the config" in r.stdout.splitlines(), r.stdout
    assert "commands found" not in r.stdout


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


def test_doctor_without_a_daemon_names_a_remote_upstream_nothing_answers_for(tmp_path: Path) -> None:
    """With no daemon to report its upstreams' states, a remote upstream whose port refuses
    is one FAIL line naming it, the host and port (never the URL's password or query), and
    what to do; a remote upstream that accepts connections is not. Before, doctor said
    nothing of remote upstreams until a daemon ran."""
    listening = socket.create_server(("127.0.0.1", 0))
    refused = free_port()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "none.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
                   f'metrics_addr = ""\n[search]\nembedder = "none"\n'
                   f'[[upstream]]\nname = "up"\ntransport = "http"\n'
                   f'url = "http://127.0.0.1:{listening.getsockname()[1]}/mcp"\n'
                   f'[[upstream]]\nname = "down"\ntransport = "sse"\n'
                   f'url = "http://me:pw-secret@127.0.0.1:{refused}/sse?key=q-secret"\n')
    with listening:
        r = _run("doctor", "--config", str(cfg))
    assert r.returncode == 1, r.stdout
    urls = [line for line in r.stdout.splitlines() if line.startswith(("FAIL  url", "ok    url"))]
    assert urls == [f"FAIL  url: upstream 'down': cannot connect to 127.0.0.1:{refused} (Connection refused): "
                    "start that server, or fix its `url` in the config"], r.stdout
    assert "secret" not in r.stdout


def test_doctor_on_a_socket_that_accepts_but_never_answers_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wedged daemon (or a stopped one, or another program on its socket) holds the socket:
    starting a second daemon there is not the fix, and doctor must not say it is."""
    from toolatlas import doctor

    sock = tmp_path / "mute.sock"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\nmetrics_addr = ""\n'
                   '[search]\nembedder = "none"\n')
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(sock))
    mute.listen(8)  # accepted by the kernel, never read
    monkeypatch.setattr(doctor, "DAEMON_ANSWER_S", 0.5, raising=False)
    try:
        checks = doctor.run_checks(str(cfg))
    finally:
        mute.close()
    daemon = [c for c in checks if c.what == "daemon"]
    assert daemon and daemon[0].level == doctor.FAIL
    assert "accepts connections but did not answer within 0.5 s" in daemon[0].detail, daemon[0].detail
    assert "start it with" not in daemon[0].detail and "restart" in daemon[0].detail, daemon[0].detail


def _started_and_found(tmp_path: Path, bin_dir: Path, command: str, *, env: dict[str, str] | None = None,
                       cwd: Path | None = None) -> None:
    """A python wrapper script at `bin_dir/py`, a daemon (config in tmp_path/d) whose stdio
    upstream runs it as `command`: the daemon, started with `env` in folder `cwd`, brings it
    up, and doctor, run the same way, finds it."""
    from tests.support.servers import testserver_args

    bin_dir.mkdir(parents=True)
    (bin_dir / "py").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "py").chmod(0o755)
    (tmp_path / "d").mkdir(exist_ok=True)
    block = f'[[upstream]]\nname = "t"\ntransport = "stdio"\ncommand = "{command}"\nargs = {json.dumps(testserver_args())}\n'
    d = Daemon(tmp_path / "d", block)
    with d.start(env=env, cwd=cwd):
        states = d.wait_for(lambda: (s := {x["name"]: x for x in d.status()["servers"]})["t"]["state"] in
                            ("ready", "degraded") and s, 30, "t ready or degraded")
        assert states["t"]["state"] == "ready", states["t"]
        r = subprocess.run([sys.executable, "-m", "toolatlas", "doctor", "--config", str(d.config)],
                           capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=60)
        assert "ok    commands: all 1 stdio upstream commands found" in r.stdout.splitlines(), r.stdout


def test_a_command_under_home_written_with_a_tilde_is_started(tmp_path: Path) -> None:
    """`command = "~/bin/..."`: check-config and doctor expand the `~` (as for every other
    path in the config), so the daemon must start that same file."""
    home = tmp_path / "home"
    _started_and_found(tmp_path, home / "bin", "~/bin/py", env={"HOME": str(home)})


def test_a_relative_command_is_from_the_config_files_folder(tmp_path: Path) -> None:
    """README: relative paths resolve against the config file's folder. `command =
    "./bin/py"` without a `cwd` must start the file beside the config, whatever folder the
    daemon (or doctor) runs in: before, the daemon looked in its own working folder (under
    systemd, `/`) and doctor in the shell's."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _started_and_found(tmp_path, tmp_path / "d" / "bin", "./bin/py", cwd=elsewhere)


def test_variables_kept_in_the_environment_file_are_not_a_config_failure(tmp_path: Path) -> None:
    """README: the config's ${VAR}s may be kept in ~/.config/toolatlas/environment, not the
    shell (the daemon reads it, however it is started). doctor must not call that config broken."""
    xdg = tmp_path / "xdg"
    (xdg / "toolatlas").mkdir(parents=True)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{tmp_path / "state"}"\nmetrics_addr = ""\n'
                   '[search]\nembedder = "none"\n[[upstream]]\nname = "web"\ntransport = "http"\n'
                   'url = "http://127.0.0.1:9/mcp"\nheaders = { Authorization = "Bearer ${TOOLATLAS_T_TOKEN}" }\n')
    (xdg / "toolatlas" / "environment").write_text("TOOLATLAS_T_TOKEN=s3cret-value\n")
    env = {k: v for k, v in os.environ.items() if k != "TOOLATLAS_T_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "toolatlas", "doctor", "--config", str(cfg)], capture_output=True,
                       text=True, env={**env, "XDG_CONFIG_HOME": str(xdg)}, timeout=60)
    assert f"ok    config: {cfg} is valid (1 upstreams)" in r.stdout.splitlines() and "s3cret" not in r.stdout, r.stdout
    assert f"FAIL  daemon: no answer at {tmp_path / 's.sock'}" in r.stdout  # the config's socket, not the default


def test_a_socket_path_that_is_not_a_socket_is_no_advice_to_start_the_daemon(tmp_path: Path) -> None:
    """It read "no answer at X (Connection refused); start it with `toolatlas serve`", which
    would fail too: the daemon refuses to replace a file that is no socket."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "c.toml"}"\nstate_dir = "{tmp_path / "state"}"\n'
                   'metrics_addr = ""\n[search]\nembedder = "none"\n')
    r = _run("doctor", "--config", str(cfg))
    assert r.returncode == 1, r.stdout
    assert (f"FAIL  daemon: {cfg} is a regular file, not a socket: point --socket, $TOOLATLAS_SOCKET or the "
            "config's [daemon] socket at the daemon's socket") in r.stdout.splitlines(), r.stdout


def test_a_state_dir_this_user_cannot_reach_is_a_fail_line_not_a_traceback(tmp_path: Path) -> None:
    """A state_dir inside a folder closed to the user running doctor (the daemon's 0700 folder,
    another user's home: `sudo -u` keeping HOME) was a PermissionError traceback from exists()."""
    if os.geteuid() != 0:
        pytest.skip("a user of another uid needs root to drop to it")
    base = tempfile.mkdtemp(prefix="toolatlas-doctor-")  # pytest's tmp_path is closed to other users
    try:
        os.chmod(base, 0o755)
        closed = os.path.join(base, "closed")
        os.mkdir(closed, 0o700)
        cfg = os.path.join(base, "c.toml")
        with open(cfg, "w") as fh:
            fh.write(f'[daemon]\nsocket = "{base}/s.sock"\nstate_dir = "{closed}/state"\nmetrics_addr = ""\n'
                     '[search]\nembedder = "none"\n')
        os.chmod(cfg, 0o644)

        def doctor() -> list[object]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = doctor_cli.main(["--config", cfg])
            return [code, out.getvalue()]

        doctor()  # as root first: what it imports on its way is loaded before run_as drops to a user who cannot
        code, out = run_as(pwd.getpwnam("nobody"), doctor)
    finally:
        shutil.rmtree(base)
    assert code == 1, out
    assert (f"FAIL  state dir: cannot look at {closed}/state (Permission denied): this user cannot reach "
            f"{closed}/state; run doctor as the user the daemon runs as, or change [daemon] state_dir") \
        in str(out).splitlines(), out


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
    # A config that fails elsewhere still names its state folder: that one is checked, not the default.
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{blocker / "state"}"\n'
                   '[[upstream]]\nname = "Bad_Name"\ntransport = "stdio"\ncommand = "true"\n')
    r = _run("doctor", "--config", str(cfg))
    assert r.returncode == 1 and "FAIL  config: " in r.stdout and "Bad_Name" in r.stdout
    assert f"FAIL  state dir: {blocker} is not a folder" in r.stdout, r.stdout


def test_search_k_outside_its_range_is_a_usage_error(tmp_path: Path) -> None:
    for k in ("0", "21", "many"):
        r = _run("search", "anything", "--k", k, "--socket", str(tmp_path / "none.sock"))
        assert r.returncode == 2 and "argument --k: must be" in r.stderr and "from 1 to 20" in r.stderr, r.stderr


def test_doctor_checks_the_shared_store(tmp_path: Path, pg_url: str) -> None:
    """[store] url: unreachable (FAIL, the password nowhere), reachable without the schema
    (WARN: the next replica applies the migrations), reachable and migrated (ok); no store
    line without [store]. The real PostgreSQL of the pg fixtures."""
    import anyio

    from tests.support.ports import free_port
    from toolatlas.redact import Redactor
    from toolatlas.store.client import Store
    from toolatlas.store.schema import LATEST

    def store_line(url: str, name: str, env: dict[str, str] | None = None) -> str:
        cfg = tmp_path / f"{name}.toml"
        store = f'[store]\nurl = "{url}"\nconnect_timeout = 2\n' if url else ""
        cfg.write_text(f'[daemon]\nsocket = "{tmp_path / name}.sock"\nstate_dir = "{tmp_path / name}"\n'
                       f'[search]\nembedder = "none"\n{store}')
        r = subprocess.run([sys.executable, "-m", "toolatlas", "doctor", "--config", str(cfg)], capture_output=True,
                           text=True, env=dict(os.environ, **(env or {})), timeout=60, check=False)
        lines = [line for line in r.stdout.splitlines() if "  store: " in line]
        assert "pg-doctor-secret" not in r.stdout + r.stderr
        return lines[0] if lines else ""

    assert store_line("", "none") == ""
    down = store_line(f"postgresql://toolatlas:${{TA_PGPW}}@127.0.0.1:{free_port()}/toolatlas", "down",
                      {"TA_PGPW": "pg-doctor-secret"})
    assert down.startswith("FAIL  store: cannot reach the database (") and "check [store] url" in down, down
    fresh = store_line(pg_url, "fresh")
    assert fresh.startswith("WARN  store: reachable; migration(s) 1 (") and "the next replica to start applies" in fresh

    async def migrate() -> None:
        store = Store(pg_url, origin="doctor-test", connect_timeout=5, redactor=Redactor())
        await store.connect()
        try:
            await store.migrate()
        finally:
            await store.close()

    anyio.run(migrate)
    assert store_line(pg_url, "migrated") == f"ok    store: reachable, schema at version {LATEST}"


def test_call_args_that_are_not_a_json_object_are_a_usage_error_before_any_daemon_is_asked(tmp_path: Path) -> None:
    deep = '{"a": ' + "[" * 20000 + "]" * 20000 + "}"  # was a RecursionError traceback
    for given, said in (("{bad", "--args is not valid JSON"), ("[1, 2]", "--args must be a JSON object"),
                        (deep, "--args is not valid JSON: nested too deeply to read")):
        r = _run("call", "notes__add_note", "--args", given, "--socket", str(tmp_path / "none.sock"))
        assert r.returncode == 64 and said in r.stderr and "cannot reach" not in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr


def test_doctor_warns_of_an_access_rule_that_matches_no_one(tmp_path: Path) -> None:
    """What check-config warns of in [[access]] (a user name this host does not know: the
    user meant gets access_default) doctor shows as a WARN line too; WARN is no problem."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nsocket = "{tmp_path / "none.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
                   f'[[upstream]]\nname = "s"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
                   '[[access]]\nusers = ["no-such-user-xq"]\nservers = ["s"]\n')
    r = _run("doctor", "--config", str(cfg))
    assert any(line.startswith("WARN  access: [[access]] rule 1 names user 'no-such-user-xq'")
               for line in r.stdout.splitlines()), r.stdout
