"""The shim survives the daemon (#16 items 2 and 3): the real SDK client, connected once
through `toolatlas shim`, across a daemon SIGKILL (or SIGTERM) and restart; and
`toolatlas shim --config` starting the one daemon that five shims need."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.processes import descendants, kill_all, parent_of, pid_alive, wait_gone

PASSTHROUGH = "shim-restart-client"  # sees the upstream's tools, so the daemon announces their changes
META = ["tool_search", "execute_tool", "catalog_status"]


def shim(*args: str) -> StdioServerParameters:
    # The SDK passes only a few variables to a server by default; PYTHONPATH must reach the
    # shim so that it runs this checkout's code.
    return StdioServerParameters(command=sys.executable, args=["-m", "toolatlas", "shim", *args], env=dict(os.environ))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("shim-restart"), stdio_testserver("alpha"),
               daemon_extra=f'passthrough_clients = ["{PASSTHROUGH}"]')
    with d:
        yield d


def _upstream_ready(d: Daemon) -> None:
    d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 60, "upstream ready")


def _restart(d: Daemon, sig: int) -> None:
    assert d.proc is not None
    kids = descendants(d.proc.pid)
    d.stop(sig)
    kill_all(kids)


def _text(result: types.CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, types.TextContent))


class Watcher:
    """Counts tools/list_changed a client hears: as a session notification (legacy) or on a
    `subscriptions/listen` stream (2026-07-28)."""

    def __init__(self) -> None:
        self.session = 0
        self.stream = 0

    async def on_message(self, msg: Any) -> None:
        if isinstance(msg, types.ToolListChangedNotification):
            self.session += 1

    async def listen(self, c: Client, ready: anyio.Event) -> None:
        async with c.listen(tools_list_changed=True) as sub:
            ready.set()
            async for _event in sub:
                self.stream += 1

    def heard(self, mode: str) -> int:
        return self.session if mode == "legacy" else self.stream


async def _until(check: Any, seconds: float = 20) -> None:
    with anyio.fail_after(seconds):
        while not check():
            await anyio.sleep(0.02)


@pytest.mark.parametrize(("mode", "sig"), [("legacy", signal.SIGKILL), ("auto", signal.SIGKILL),
                                           ("legacy", signal.SIGTERM)])
async def test_sdk_client_goes_on_across_a_daemon_restart(daemon: Daemon, mode: str, sig: int) -> None:
    """Two clients through two shims: `c` is a passthrough client (the daemon announces its
    list changes to it), `meta` sees the three meta-tools (the daemon never announces a change
    to it: what it hears after the restart comes from its shim)."""
    _upstream_ready(daemon)
    slow: dict[str, Any] = {}

    async def hang(c: Client) -> None:
        try:
            slow["result"] = await c.call_tool("execute_tool", {"name": "alpha__hang", "arguments": {}})
        except MCPError as exc:
            slow["error"] = exc

    w, wm = Watcher(), Watcher()
    info = types.Implementation(name=PASSTHROUGH, version="1")
    with anyio.fail_after(150):
        async with (Client(shim("--socket", daemon.socket), mode=mode, client_info=info,
                           message_handler=w.on_message) as c,
                    Client(shim("--socket", daemon.socket), mode=mode, message_handler=wm.on_message) as meta,
                    anyio.create_task_group() as tg):
            assert c.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            if mode == "auto":
                ready, ready_meta = anyio.Event(), anyio.Event()
                tg.start_soon(w.listen, c, ready)
                tg.start_soon(wm.listen, meta, ready_meta)
                await ready.wait()
                await ready_meta.wait()
            assert "alpha__echo" in {t.name for t in (await c.list_tools()).tools}
            tg.start_soon(hang, c)
            await anyio.wait_all_tasks_blocked()  # the hang request is written to the shim...
            # ...and the daemon has read it once it answers a request sent after it.
            assert _text(await c.call_tool("alpha__echo", {"message": "before"})) == "Echo: before"

            await anyio.to_thread.run_sync(_restart, daemon, sig)
            await _until(lambda: slow)  # the call in flight gets an error, not silence
            if sig == signal.SIGKILL:  # from the shim
                assert "error" in slow, slow
                assert "in flight" in slow["error"].error.message and "retry" in slow["error"].error.message
            else:  # a draining daemon closes its upstreams and answers the call itself
                assert "result" in slow and slow["result"].is_error, slow

            with anyio.fail_after(10):  # while the daemon is down: an error at once, no hang
                with pytest.raises(MCPError) as down:
                    await c.call_tool("alpha__echo", {"message": "down"})
            assert "restarting" in down.value.error.message and "retry" in down.value.error.message

            # Started from this thread, not a worker: the daemon gets SIGTERM when the thread
            # that spawned it ends (PR_SET_PDEATHSIG), and the loop may block while it starts.
            daemon.start()
            await anyio.to_thread.run_sync(_upstream_ready, daemon)
            # The same clients, never reconnected: their next calls succeed.
            assert _text(await c.call_tool("alpha__echo", {"message": "after"})) == "Echo: after"
            done = await meta.call_tool("execute_tool", {"name": "alpha__echo", "arguments": {"message": "m"}})
            assert _text(done) == "Echo: m"
            await _until(lambda: wm.heard(mode) >= 1)  # from the shim: the daemon never tells `meta`
            # The passthrough session was resumed on the new daemon, not patched over by the shim:
            # the daemon knows the client by the name it gave at initialize (legacy: replayed),
            # and its list change reaches the client (2026-07-28: on the re-sent listen stream).
            assert "alpha__echo" in {t.name for t in (await c.list_tools(cache_mode="refresh")).tools}
            await _until(lambda: w.heard(mode) >= 1)
            before = w.heard(mode)
            await c.call_tool("alpha__add_tool", {"name": "owl_counter", "description": "Count owls."})
            await _until(lambda: w.heard(mode) > before)
            assert "alpha__owl_counter" in {t.name for t in (await c.list_tools(cache_mode="refresh")).tools}
            await c.call_tool("alpha__remove_tool", {"name": "owl_counter"})
            tg.cancel_scope.cancel()


# -- shim --config: the shim starts the daemon ---------------------------------------------------

def _daemons_of(config: Path) -> list[int]:
    """Pids of `toolatlas serve --config CONFIG` processes, from /proc. A child the daemon is
    forking (the token counter, an upstream) shows the daemon's argv until it execs: one
    whose parent matches too is not a daemon (seen once beside a CPU hog)."""
    found: dict[int, int] = {}  # pid -> parent pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = parent_of(entry)
        if b"serve" in argv and str(config).encode() in argv and ppid is not None and pid_alive(int(entry)):
            found[int(entry)] = ppid
    return [pid for pid, ppid in found.items() if ppid not in found]


@pytest.fixture
def no_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A config whose daemon is not running; any daemon a shim starts for it is killed at teardown."""
    d = Daemon(tmp_path, stdio_testserver("alpha"))
    try:
        yield d
    finally:
        pids = _daemons_of(d.config)
        kids = {k for p in pids for k in descendants(p)}
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        kill_all(wait_gone(pids, 30))
        kill_all(kids)


async def test_five_shims_at_once_start_one_daemon(no_daemon: Daemon) -> None:
    config = no_daemon.config
    assert not _daemons_of(config)
    listed: list[list[str]] = []
    interim: list[list[str]] = []

    async def one() -> None:
        async with Client(shim("--config", str(config)), mode="legacy") as c:
            # Until its index is ready a fresh daemon lists the upstream tools themselves
            # (passthrough, issue 16 item 4), or none before the first upstream has listed.
            while (tools := [t.name for t in (await c.list_tools(cache_mode="refresh")).tools]) != META:
                interim.append(tools)
                await anyio.sleep(0.1)
            listed.append(tools)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(one)
    assert listed == [META] * 5
    assert all(not tools or all(t.startswith("alpha__") for t in tools) for tools in interim), interim
    pids = _daemons_of(config)
    assert len(pids) == 1, pids
    (pid,) = pids
    log = Path(no_daemon.tmp / "state" / "daemon.log")
    assert log.read_text().count("starts the daemon") == 1
    # Detached from the clients: its own session, stdin from /dev/null, output to the log;
    # the shims are gone and it runs on.
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(stat[3]) == pid  # session id (setsid)
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/2") == str(log)
    # the daemon keeps that log bounded (toolatlas.logfile): the shim asked it to
    assert b"\0TOOLATLAS_LOG_MAX_BYTES=10485760\0" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    assert pid_alive(pid)


async def test_shim_config_starts_a_crashed_daemon_again(no_daemon: Daemon) -> None:
    """Nobody supervises the daemon a shim started: when it dies, the shim starts it again
    (after RESPAWN_AFTER_S of silence), and the same client session goes on."""
    config = no_daemon.config
    with anyio.fail_after(180):
        async with Client(shim("--config", str(config)), mode="legacy") as c:
            while not (await c.list_tools(cache_mode="refresh")).tools:
                await anyio.sleep(0.1)
            (first,) = _daemons_of(config)
            kids = descendants(first)
            os.kill(first, signal.SIGKILL)
            assert wait_gone([first]) == []
            kill_all(kids)
            refusals = 0
            while True:  # bounded by the deadline above
                try:
                    status = await c.call_tool("catalog_status", {})
                    break
                except MCPError as exc:  # sent before the shim saw the drop: "in flight"
                    assert "restarting" in exc.error.message or "in flight" in exc.error.message, exc.error.message
                    refusals += 1
                    await anyio.sleep(0.2)
            assert not status.is_error and refusals > 0
            (second,) = _daemons_of(config)
            assert second != first
    assert (no_daemon.tmp / "state" / "daemon.log").read_text().count("starts the daemon") == 2


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


def _handshake_then_eof(config: Path | str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[bytes], list[Any]]:
    """`toolatlas shim --config CONFIG` (no daemon running) fed an initialize and its
    notification, then EOF on stdin; the shim's exit and the replies it wrote."""
    lines = json.dumps(INIT).encode() + b'\n{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
    proc = subprocess.run([sys.executable, "-m", "toolatlas", "shim", "--config", str(config)],
                          input=lines, capture_output=True, timeout=120, env=env)
    return proc, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_shim_config_reports_a_daemon_that_will_not_start(no_daemon: Daemon) -> None:
    """The daemon the shim starts exits (a config error): the held handshake is answered with
    an error naming the exit status and the log, not held for a minute."""
    no_daemon.config.write_text(no_daemon.config.read_text() + '\n[no_such_key]\nx = 1\n')
    proc = subprocess.Popen([sys.executable, "-m", "toolatlas", "shim", "--config", str(no_daemon.config)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin and proc.stdout and proc.stderr
    try:
        proc.stdin.write(json.dumps(INIT).encode() + b"\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline())  # bounded: the shim answers within its wait
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.stderr.close()
    assert reply["id"] == 1 and reply["error"]["code"] == -32000
    message = reply["error"]["message"]
    assert "exited with status 78" in message and "daemon.log" in message, message
    assert "no_such_key" in (no_daemon.tmp / "state" / "daemon.log").read_text()
    assert "started the daemon" in err


def test_shim_config_says_at_once_why_it_cannot_start_the_daemon(no_daemon: Daemon, tmp_path: Path) -> None:
    """A state_dir that cannot be made (here a path under a regular file; an unwritable folder
    alike): the daemon's log cannot be opened, so no daemon starts. The held handshake is
    answered at once with the path and the key to fix. Before, the client waited the whole
    60 s and then read 'the daemon is starting ... retry in a few seconds'."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    text = no_daemon.config.read_text()
    assert f'state_dir = "{no_daemon.tmp / "state"}"' in text
    no_daemon.config.write_text(text.replace(f'state_dir = "{no_daemon.tmp / "state"}"',
                                             f'state_dir = "{blocker / "state"}"'))
    proc, replies = _handshake_then_eof(no_daemon.config)
    assert proc.returncode == 0, proc.stderr.decode()
    assert [r.get("id") for r in replies] == [1], replies
    message = replies[0]["error"]["message"]
    assert f"cannot write its log {blocker / 'state' / 'daemon.log'}" in message, message
    assert "Not a directory" in message and "[daemon] state_dir" in message, message
    assert not _daemons_of(no_daemon.config)


def test_shim_config_answers_a_held_handshake_after_the_client_closes_stdin(no_daemon: Daemon) -> None:
    """A client that writes its requests and closes stdin while the daemon is still being
    started is owed the replies, as when the daemon is up: the held initialize is answered
    (by the daemon once it answers), never dropped in silence."""
    proc, replies = _handshake_then_eof(no_daemon.config)
    assert proc.returncode == 0, proc.stderr.decode()
    assert [r.get("id") for r in replies] == [1], (replies, proc.stderr.decode())
    assert replies[0]["result"]["serverInfo"]["name"] == "toolatlas", replies


def test_shim_config_under_home_written_with_a_tilde_is_found(no_daemon: Daemon) -> None:
    """Clients start the shim without a shell: `"args": ["shim", "--config",
    "~/.config/toolatlas/config.toml"]` reached it with the ~ as written, and it exited 78
    ('cannot read the socket from '~/...'). The shim now reads ~ as the home folder, as the
    config does in its own paths."""
    home = no_daemon.tmp.parent
    proc, replies = _handshake_then_eof(f"~/{no_daemon.config.relative_to(home)}", dict(os.environ, HOME=str(home)))
    assert proc.returncode == 0, proc.stderr.decode()
    assert [r.get("id") for r in replies] == [1] and "result" in replies[0], (replies, proc.stderr.decode())
    assert _daemons_of(no_daemon.config), "the daemon the shim started is not running"


def test_a_daemon_the_shim_starts_reads_its_secrets_from_the_environment_file(no_daemon: Daemon, tmp_path: Path) -> None:
    """`adopt` keeps a client's secrets in ~/.config/toolatlas/environment and the config
    reads them as ${VAR}; a daemon the shim starts has the GUI client's environment, which
    does not set them, so the config loader falls back to that file. Before, that daemon
    exited 78 ('environment variable ${...} is not set')."""
    no_daemon.config.write_text(no_daemon.config.read_text() + '\n[[upstream]]\nname = "web"\ntransport = "http"\n'
                                'url = "http://127.0.0.1:9/mcp"\nheaders = { Authorization = "Bearer ${TOOLATLAS_T_SECRET}" }\n')
    xdg = tmp_path / "xdg"
    (xdg / "toolatlas").mkdir(parents=True)
    (xdg / "toolatlas" / "environment").write_text("TOOLATLAS_T_SECRET=s3cret-value\n")
    env = {k: v for k, v in os.environ.items() if k != "TOOLATLAS_T_SECRET"} | {"XDG_CONFIG_HOME": str(xdg)}
    proc, replies = _handshake_then_eof(no_daemon.config, env)
    assert [r.get("id") for r in replies] == [1] and "result" in replies[0], (replies, proc.stderr.decode())
    assert _daemons_of(no_daemon.config), "the daemon the shim started is not running"
    assert "s3cret" not in (no_daemon.tmp / "state" / "daemon.log").read_text()


async def test_a_daemon_gone_for_good_is_not_said_to_be_restarting_forever(tmp_path: Path) -> None:
    """The shim answers a request while no daemon answers with 'restarting ... retry in a few
    seconds'. For a daemon stopped for good that was said as long as the client kept asking;
    after GONE_AFTER_S the answer says nothing has answered for that long, and asks whether
    the daemon runs."""
    gone = Daemon(tmp_path, stdio_testserver("alpha"))
    with gone, anyio.fail_after(120):
        async with Client(shim("--socket", gone.socket), mode="legacy") as c:
            assert _text(await c.call_tool("alpha__echo", {"message": "up"})) == "Echo: up"
            await anyio.to_thread.run_sync(_restart, gone, signal.SIGTERM)
            with pytest.raises(MCPError) as soon:
                await c.call_tool("alpha__echo", {"message": "down"})
            assert "restarting" in soon.value.error.message and "running?" not in soon.value.error.message
            while True:  # polls the shim, as a client retrying would
                with pytest.raises(MCPError) as later:
                    await c.call_tool("alpha__echo", {"message": "still down"})
                if "has answered there for" in later.value.error.message:
                    break
                await anyio.sleep(0.5)
            assert "is `toolatlas serve` running?" in later.value.error.message, later.value.error.message
