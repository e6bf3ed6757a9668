"""The suite's fork server (tests/support/servers/forkserver.py): a stdio test server started
through its launcher behaves, seen from the process that started it, as one exec'd there; a
daemon forked for a test (tests/support/forked.py) as one started with Popen."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.support import servers
from tests.support.daemon import Daemon, stdio_testserver
from tests.support.forked import Forked
from tests.support.processes import children_of, descendants, wait_gone
from tests.support.servers import FORKSERVER, TESTSERVER, testserver_args
from tests.support.servers.forkserver import DAEMON

pytestmark = pytest.mark.timeout(120)


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    _rpc(proc, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "test", "version": "0"}}, 1)
    _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _send(proc: subprocess.Popen[bytes], msg: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(msg).encode() + b"\n")
    proc.stdin.flush()


def _rpc(proc: subprocess.Popen[bytes], method: str, params: dict[str, Any], rid: int) -> dict[str, Any]:
    _send(proc, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, f"the server closed its stdout (exit {proc.poll()})"
        msg = json.loads(line)
        if msg.get("id") == rid:
            return msg  # type: ignore[no-any-return]


def _pid(proc: subprocess.Popen[bytes]) -> int:
    return int(_rpc(proc, "tools/call", {"name": "pid", "arguments": {}}, 2)["result"]["content"][0]["text"])


def _forked_children() -> set[int]:
    assert servers.forkserver_socket() is not None, "the suite runs without its fork server"
    assert servers._forkserver is not None
    return descendants(servers._forkserver[0].pid)


def test_the_launcher_is_the_server_its_client_started() -> None:
    args = testserver_args()
    assert args[:3] == ["-S", str(FORKSERVER), "--via"] and str(TESTSERVER) in args
    before = _forked_children()
    proc = _start(args)
    try:
        assert _pid(proc) == proc.pid  # `pid` names the launcher
        (child,) = _forked_children() - before
        assert child != proc.pid
        # its exit code comes back through the launcher
        _send(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "crash", "arguments": {"code": 7}}})
        assert proc.wait(timeout=30) == 7
        assert wait_gone({child}, timeout=30) == []
    finally:
        _stop(proc)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)])
def test_a_signal_to_the_launcher_ends_the_server(sig: int, code: int) -> None:
    """SIGTERM is relayed and the launcher dies of it as the server did; a SIGKILL, which no
    process can relay, makes the fork server kill the child whose launcher's connection closed."""
    before = _forked_children()
    proc = _start(testserver_args())
    try:
        (child,) = _forked_children() - before
        os.kill(proc.pid, sig)
        assert proc.wait(timeout=30) == code
        assert wait_gone({child}, timeout=30) == []
    finally:
        _stop(proc)


def test_sigint_then_eof_ends_it_as_it_ends_an_exec_d_server() -> None:
    """The server takes SIGINT as a KeyboardInterrupt, then ends once its stdin reader returns.
    Through the launcher the same exit comes back (a launcher that kept SIGINT for itself would
    die of it)."""
    codes = []
    for args in (testserver_args(exec_=True), testserver_args()):
        proc = _start(args)
        try:
            # A server at rest: an answer means it has read `notifications/initialized` too. One
            # still reading it when the SIGINT cancels its session ends with the SDK's
            # BrokenResourceError, exit 1 (2 of 60 starts through the launcher beside a CPU
            # hog; 0 of 300 beside two hogs with this answer first).
            _pid(proc)
            proc.send_signal(signal.SIGINT)
            assert proc.stdin is not None
            proc.stdin.close()
            codes.append(proc.wait(timeout=30))
        finally:
            _stop(proc)
    assert codes[0] == codes[1], codes


def test_closing_stdin_ends_the_server_and_its_launcher() -> None:
    proc = _start(testserver_args())
    assert proc.stdin is not None
    try:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        _stop(proc)


def test_with_no_fork_server_the_launcher_execs_the_server(tmp_path: Any) -> None:
    proc = _start(["-S", str(FORKSERVER), "--via", str(tmp_path / "nothing.sock"), str(TESTSERVER)])
    try:
        assert _pid(proc) == proc.pid  # the same process, now the server itself
        with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
            assert fh.read().split(b"\0")[1] == str(TESTSERVER).encode()
    finally:
        _stop(proc)


def test_exec_bypasses_the_fork_server() -> None:
    assert testserver_args("--tools", "2", exec_=True) == [str(TESTSERVER), "--transport", "stdio", "--tools", "2"]


def _python_with_a_fork_server(code: str) -> subprocess.CompletedProcess[str]:
    """`python -c CODE` from the repo root, as a pytest worker that uses a fork server."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90,
                          env=dict(os.environ, **{servers.FORKSERVER_ENV: "1"}), cwd=str(servers.FORKSERVER.parents[3]))


_THREAD_STARTS_IT = """
import os, sys, threading, time
from tests.support import servers

started = []
thread = threading.Thread(target=lambda: started.append(servers.forkserver_socket()))
thread.start()
thread.join()
proc = servers._forkserver[0]
deadline = time.monotonic() + 2  # a pass waits it out; PR_SET_PDEATHSIG killed within ms of the thread's end
while proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
print(started[0] is not None, proc.poll(), servers.forkserver_socket() is not None)
"""


def test_the_fork_server_outlives_the_thread_that_started_it() -> None:
    """A worker's fork server is started by whichever thread first builds a stdio test server's
    args. It was started with PR_SET_PDEATHSIG, which fires when that *thread* ends: started
    from a short-lived thread it was killed, and the rest of the worker's servers were exec'd
    (seen as three of this file's tests failing in a run beside a CPU hog). It now ends when
    the pytest process is gone (its stdin, a pipe from that process, reads EOF)."""
    out = _python_with_a_fork_server(_THREAD_STARTS_IT)
    assert out.stdout.split() == ["True", "None", "True"], (out.stdout, out.stderr)


def test_the_fork_server_ends_with_the_process_that_started_it() -> None:
    """The other half: once the pytest process is gone (killed outright, no atexit), so are its
    fork server and the servers it forked."""
    script = ("import os, signal, sys\nfrom tests.support import servers\n"
              "servers.forkserver_socket()\nprint(servers._forkserver[0].pid, flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = _python_with_a_fork_server(script)
    pid = int(out.stdout.split()[0])
    assert wait_gone({pid}, timeout=30) == [], "the fork server outlived the process that started it"


# --- daemons (tests.support.forked.Forked, Daemon.start) ---------------------------------------

def _forked(tmp_path: Any, argv: list[str], **env: str) -> tuple[Forked, Any]:
    sock = servers.forkserver_socket()
    assert sock is not None, "the suite runs without its fork server"
    log = tmp_path / "out.log"
    with open(log, "wb") as out, open(os.devnull, "rb") as devnull:
        proc = Forked(sock, DAEMON, argv, env=dict(os.environ, PYTHONUNBUFFERED="1", **env), cwd=tmp_path,
                      stdin=devnull.fileno(), stdout=out.fileno(), stderr=out.fileno())
    return proc, log


def test_a_forked_command_has_the_request_s_argv_folder_and_environment(tmp_path: Any) -> None:
    """`toolatlas check-config toolatlas.toml` forked: the relative path is read in the folder
    asked for, `${VAR}` expands from the environment sent (not the fork server's), the output
    lands on the descriptors sent, and the exit code comes back."""
    (tmp_path / "toolatlas.toml").write_text('[daemon]\nsocket = "${FORKED_SOCKET_DIR}/t.sock"\n')
    proc, log = _forked(tmp_path, ["check-config", "toolatlas.toml"], FORKED_SOCKET_DIR=str(tmp_path / "here"))
    assert proc.wait(timeout=60) == 0, log.read_text()
    assert f"toolatlas.toml: OK (0 upstreams; socket {tmp_path / 'here'}/t.sock)" in log.read_text()
    (tmp_path / "toolatlas.toml").write_text("[daemon\n")
    proc, log = _forked(tmp_path, ["check-config", "toolatlas.toml"])
    assert proc.wait(timeout=60) == 78 and "config error" in log.read_text(), log.read_text()


def test_a_forked_daemon_is_the_process_its_test_holds(tmp_path: Any) -> None:
    """Its pid is the daemon's own (its stdio child is its child), its log is written as it
    goes (unbuffered, as PYTHONUNBUFFERED asks), SIGTERM ends it with 0, and poll/wait report
    it as Popen would."""
    d = Daemon(tmp_path, stdio_testserver("one")).start()
    assert isinstance(d.proc, Forked)
    assert d.search("add two numbers")[:1] == ["one__add_tool"]
    assert children_of(d.proc.pid), "the stdio upstream is not a child of the pid the test holds"
    kids = descendants(d.proc.pid)
    assert "upstream one" in d.log.read_text()  # before it ends: nothing held in a buffer
    assert d.proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        d.proc.wait(timeout=0.1)
    assert d.stop(signal.SIGTERM) == 0 and d.proc.poll() == 0
    assert "stopped" in d.log.read_text()
    assert wait_gone(kids, timeout=30) == []


def test_a_forked_daemon_killed_or_let_go_is_gone(tmp_path: Any) -> None:
    """SIGKILL reads as -9, as from Popen; and a daemon whose Forked is closed (its test's
    process gone) is killed by the fork server, never left running."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    d = Daemon(tmp_path / "a", "").start(ready=False)
    assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    d = Daemon(tmp_path / "b", "").start(ready=False)
    assert isinstance(d.proc, Forked)
    pid = d.proc.pid
    d.proc._conn.close()
    d._logfh.close()
    assert wait_gone({pid}, timeout=30) == [], "the daemon outlived the connection that held it"


def test_exec_starts_a_fresh_interpreter(tmp_path: Any) -> None:
    d = Daemon(tmp_path, "").start(ready=False, exec_=True)
    try:
        assert isinstance(d.proc, subprocess.Popen)
        with open(f"/proc/{d.proc.pid}/cmdline", "rb") as fh:
            assert fh.read().split(b"\0")[1:3] == [b"-m", b"toolatlas"]
    finally:
        d.stop()


def _http_pid(url: str) -> int:
    """The `pid` tool's answer over streamable HTTP, with the SDK's client."""
    import anyio
    from mcp import Client

    async def ask() -> int:
        async with Client(url) as client:
            result = await client.call_tool("pid", {})
            return int(result.content[0].text)  # type: ignore[union-attr]

    return anyio.run(ask)


def test_an_http_test_server_is_forked_and_is_the_process_its_test_holds() -> None:
    before = _forked_children()
    srv = servers.start_server("testserver", "http")
    try:
        assert isinstance(srv.proc, Forked)
        assert _forked_children() - before == {srv.pid}
        assert _http_pid(srv.url) == srv.pid  # no launcher between: the server names itself
        port = srv.port
        srv.kill(signal.SIGKILL)  # waits for its end: the port is free at once
        assert srv.proc.returncode == -signal.SIGKILL
    finally:
        srv.stop()
    again = servers.start_server("testserver", "http", port=port)  # a restart on the same port
    try:
        assert again.port == port and _http_pid(again.url) == again.pid != srv.pid
    finally:
        again.stop()
    assert again.proc.returncode == 0 or again.proc.returncode == -signal.SIGTERM
    assert not _forked_children() & {srv.pid, again.pid}


def test_an_http_test_server_with_exec_is_not_forked() -> None:
    srv = servers.start_server("testserver", "http", exec_=True)
    try:
        assert isinstance(srv.proc, subprocess.Popen)
        assert _http_pid(srv.url) == srv.pid
    finally:
        srv.stop()


def test_a_user_example_starts_through_the_launcher_as_it_runs_by_module() -> None:
    args = servers.example_args("notes")
    assert args[:3] == ["-S", str(FORKSERVER), "--via"] and args[4].endswith("toolatlas/examples/notes.py")
    assert servers.example_args("notes", exec_=True) == ["-m", "toolatlas.examples.notes", "--transport", "stdio"]
    listed = []
    for argv in (args, servers.example_args("notes", exec_=True)):
        before = _forked_children()
        proc = _start(argv)
        try:
            forked = _forked_children() - before
            assert len(forked) == (1 if argv is args else 0), forked
            tools = _rpc(proc, "tools/list", {}, 2)["result"]["tools"]
            listed.append(sorted(t["name"] for t in tools))
        finally:
            _stop(proc)
    assert listed[0] == listed[1] and "add_note" in listed[0]
    with pytest.raises(ValueError, match="not one of the examples"):
        servers.example_args("nope")
