"""Stdio children started early (upstream/children.py): real subprocesses of the project's test
server, real pipes and a real Unix socket; no daemon."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.support.configs import make_upstream, replace, stdio_testserver
from tests.support.processes import pid_alive, wait_gone
from tests.support.results import text
from toolatlas.upstream import children
from toolatlas.upstream.client import make_client
from toolatlas.upstream.transports import StdioProcess


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    yield
    children.discard()  # a failed test leaves no child behind


def _waiting_pid(name: str) -> int:
    _key, child = children._waiting[name]
    return child.pid


async def test_a_prespawned_child_is_taken_serves_and_is_reaped() -> None:
    up = stdio_testserver("early")
    assert children.prespawn([up], "") == ["early"]
    pid = _waiting_pid("early")
    assert pid_alive(pid)
    transport = StdioProcess(up)
    with anyio.fail_after(60):
        async with make_client(transport, mode="auto") as client:
            assert transport.pid == pid  # taken, not spawned again
            tools = await client.list_tools()
            assert "echo" in {t.name for t in tools.tools}
            assert text(await client.call_tool("echo", {"message": "early"})) == "Echo: early"
    assert transport.returncode is not None  # stopped and reaped by the transport
    assert not wait_gone([pid], timeout=10)
    assert "early" not in children._waiting


async def test_a_second_start_spawns_a_new_child() -> None:
    up = stdio_testserver("again")
    children.prespawn([up], "")
    first = _waiting_pid("again")
    with anyio.fail_after(60):
        async with make_client(StdioProcess(up), mode="auto") as client:
            await client.list_tools()
        transport = StdioProcess(up)
        async with make_client(transport, mode="auto") as client:
            assert text(await client.call_tool("echo", {"message": "x"})) == "Echo: x"
            assert transport.pid not in (None, first)


def test_a_child_spawned_for_other_settings_is_stopped_not_taken() -> None:
    up = stdio_testserver("changed")
    children.prespawn([up], "")
    pid = _waiting_pid("changed")
    assert children.take(replace(up, env={"EXTRA": "1"})) is None  # the config no longer matches
    assert not wait_gone([pid], timeout=10)
    assert children.take(up) is None  # and it is gone from the waiting list


def test_a_child_that_already_exited_is_not_taken() -> None:
    up = make_upstream("quits", "stdio", command=sys.executable, args=["-c", "pass"])
    children.prespawn([up], "")
    _key, child = children._waiting["quits"]
    child.wait(30)
    assert children.take(up) is None


def test_discard_stops_every_child_nobody_took() -> None:
    ups = [stdio_testserver("a"), stdio_testserver("b")]
    assert sorted(children.prespawn(ups, "")) == ["a", "b"]
    pids = [_waiting_pid("a"), _waiting_pid("b")]
    children.discard()
    assert not wait_gone(pids, timeout=10)
    assert children._waiting == {}


def test_disabled_sse_and_unstartable_upstreams_are_not_spawned() -> None:
    ups = [
        stdio_testserver("off", enabled=False),
        make_upstream("remote", "sse", url="http://127.0.0.1:9/sse"),
        make_upstream("missing", "stdio", command="/nonexistent/toolatlas-no-such-server"),
    ]
    assert children.prespawn(ups, "") == []  # the missing command is the pool's to report


def test_nothing_is_spawned_when_a_daemon_answers_on_the_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        assert children.prespawn([stdio_testserver("dup")], path) == []
    finally:
        listener.close()
    os.unlink(path)
    assert children.prespawn([stdio_testserver("dup")], path) == ["dup"]  # a stale path does not count


def test_the_child_environment_is_the_whitelist_and_the_upstream_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLATLAS_SECRET_OF_THE_DAEMON", "x")
    monkeypatch.setenv("SHELL", "() { evil; }")
    env = children.child_environment(stdio_testserver("e", env={"MINE": "1"}))
    assert env["MINE"] == "1" and env["PATH"] == os.environ["PATH"]
    assert "TOOLATLAS_SECRET_OF_THE_DAEMON" not in env and "SHELL" not in env


async def test_a_child_that_cannot_be_started_says_why_in_its_status(tmp_path: Path) -> None:
    """Each way a command fails to start is one sentence in the upstream's status, naming the
    command (a bare name with the PATH it was looked up on) or the cwd, not an errno's repr."""
    from toolatlas.upstream.pool import Pool

    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")  # not executable
    bare = tmp_path / "bare.sh"
    bare.write_text("exit 0\n")  # executable, but no '#!' line
    bare.chmod(0o755)
    ups = [
        make_upstream("nopath", "stdio", command="toolatlas-no-such-server", env={"PATH": "/nowhere/bin"}),
        make_upstream("gone", "stdio", command=str(tmp_path / "gone")),
        make_upstream("plain", "stdio", command=str(plain)),
        make_upstream("bare", "stdio", command=str(bare)),
        make_upstream("folder", "stdio", command=str(tmp_path)),
        make_upstream("nocwd", "stdio", command=sys.executable, cwd=str(tmp_path / "missing")),
    ]
    want = {
        "nopath": "command 'toolatlas-no-such-server' is not found on the PATH it gets (/nowhere/bin)",
        "gone": f"command '{tmp_path / 'gone'}' does not exist",
        "plain": f"command '{plain}' is not executable",
        "bare": f"command '{bare}' is not a program this system can run",
        "folder": f"command '{tmp_path}' is a folder",
        "nocwd": f"its cwd '{tmp_path / 'missing'}' is not a folder",
    }

    async def ignore(_name: str, _tools: object) -> None:
        return None

    pool = Pool(ups, ignore, backoff=lambda _attempt: 60.0)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            await pool.wait_settled(20)
            reasons = {s.name: s.reason or "" for s in pool.status()}
            tg.cancel_scope.cancel()
    for name, sentence in want.items():
        assert sentence in reasons[name], reasons[name]
        assert "Errno" not in reasons[name] and "\n" not in reasons[name]


_SIGNAL_DURING_SPAWN = """
import os, signal, sys
from toolatlas import cli
from toolatlas.config import StdioUpstream
from toolatlas.upstream import children

signal.signal(signal.SIGINT, cli.EarlyInterrupt())  # as `toolatlas serve` starts
real = children.spawn


def spawn(up):
    child = real(up)
    with open(sys.argv[1], "w") as fh:
        fh.write(str(child.pid))
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # the child runs; prespawn has not recorded it yet
    return child


children.spawn = spawn
children.prespawn([StdioUpstream(name="deaf", command="/bin/sh", args=["-c", "exec sleep 300"])], "")
print("the signal was lost")
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_right_after_an_early_fork_stops_that_child(tmp_path: Path, signame: str) -> None:
    """`toolatlas serve` took SIGTERM over only after the first early child was spawned: a
    SIGTERM between that fork and the handler killed the daemon by the default action and
    left the child (one that does not read its stdin) running (test_daemon_ops' SIGTERM test,
    beside two CPU hogs); a Ctrl-C there raised KeyboardInterrupt before the child was
    recorded, so nothing stopped it at exit. Both are held during a spawn and sent again once
    the child is recorded: the process still ends by the signal, and the child with it."""
    import signal
    import subprocess

    pid_file = tmp_path / "child.pid"
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_DURING_SPAWN, str(pid_file), signame],
                          capture_output=True, text=True, timeout=60)
    pid = int(pid_file.read_text())
    try:
        assert "lost" not in proc.stdout, (proc.returncode, proc.stderr)
        assert proc.returncode == -getattr(signal, signame), (proc.returncode, proc.stderr)
        assert wait_gone([pid], timeout=10) == [], "the early child outlived the signal"
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)



async def test_stdout_chunks_go_to_the_tap_only_while_the_reader_waits_with_nothing_buffered() -> None:
    """The raw relay's tap (children._PipeReader): a chunk that arrives while the reading
    task waits is offered to it; one that arrives while an earlier chunk waits to be read is
    buffered behind it, so what `receive` returns keeps the pipe's order."""
    r, w = os.pipe()
    with os.fdopen(r, "rb", buffering=0) as pipe:
        reader = await children._reader(asyncio.get_running_loop(), pipe)
        tapped: list[bytes] = []
        reader.tap = lambda data: data.startswith(b"tap") and not tapped.append(data)
        got: list[bytes] = []

        async def read_one() -> None:
            got.append(await reader.receive())

        async def waiting() -> None:
            while not reader._idle:
                await anyio.sleep(0.01)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_one)
                await waiting()
                os.write(w, b"tap 1\n")  # through the real pipe, to the tap
                while not tapped:
                    await anyio.sleep(0.01)
                os.write(w, b"plain\n")  # not the tap's: the waiting task reads it
            assert tapped == [b"tap 1\n"] and got == [b"plain\n"]
            # Two chunks in one turn of the loop while the task waits: the second, the tap's
            # kind, is buffered behind the first rather than passing it.
            protocol = reader._transport.get_protocol()
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_one)
                await waiting()
                protocol.data_received(b"first\n")
                protocol.data_received(b"tap 2\n")
            assert got[1:] == [b"first\ntap 2\n"] and tapped == [b"tap 1\n"]  # read together, in order
        await reader.aclose()
    os.close(w)
