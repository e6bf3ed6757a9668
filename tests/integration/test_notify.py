"""sd_notify against a real AF_UNIX datagram socket, the watchdog loop, socket activation."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from toolatlas import notify
from toolatlas.notify import Notifier, listen_fds, run_watchdog, scrub_environment


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


async def test_ready_stopping_reloading_watchdog_status(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    n = Notifier(path)
    assert n.enabled

    await n.ready("serving 3 upstreams\n42 tools")
    assert _fields(sock.recv(4096)) == {"READY": "1", "STATUS": "serving 3 upstreams 42 tools"}

    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    await n.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    got = _fields(sock.recv(4096))
    assert got["RELOADING"] == "1"
    assert before <= int(got["MONOTONIC_USEC"]) <= after

    n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    n.status("reindexing")
    assert sock.recv(4096) == b"STATUS=reindexing"
    n.extend_timeout(90)
    assert sock.recv(4096) == b"EXTEND_TIMEOUT_USEC=90000000"
    await n.stopping()
    assert sock.recv(4096) == b"STOPPING=1"


async def test_ready_without_status_is_a_single_assignment(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    await Notifier(path).ready()
    assert sock.recv(4096) == b"READY=1"


async def test_abstract_socket_name() -> None:
    name = f"toolatlas-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        n = Notifier("@" + name)
        assert n.enabled
        await n.ready()
        assert sock.recv(4096) == b"READY=1"


async def test_default_reads_env_and_unset_is_noop(
    notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    n = Notifier()
    assert n.enabled
    await n.stopping()
    assert sock.recv(4096) == b"STOPPING=1"

    monkeypatch.delenv("NOTIFY_SOCKET")
    off = Notifier()
    assert not off.enabled
    await off.ready()  # must not raise
    off.watchdog()
    assert off.watchdog_interval() is None


async def test_missing_socket_file_does_not_raise(tmp_path: Path) -> None:
    n = Notifier(str(tmp_path / "gone.sock"))
    assert n.enabled
    await n.ready()  # systemd went away: logged, not raised


def _fill(path: str) -> int:
    """Fill the receive queue of the datagram socket at `path`; the number of datagrams queued."""
    n = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        while True:
            try:
                s.sendto(b"FILLER=1", path)
            except BlockingIOError:
                return n
            n += 1


async def test_ready_waits_for_room_in_a_full_queue(
    notify_socket: tuple[socket.socket, str], caplog: pytest.LogCaptureFixture
) -> None:
    """systemd busy (or nobody reading yet): READY=1 is retried, not dropped, and the loop runs on."""
    sock, path = notify_socket
    sock.setblocking(False)
    queued = _fill(path)
    assert queued > 0
    n = Notifier(path)
    n.watchdog()  # a ping finds no room: dropped, not raised
    got: list[bytes] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(n.ready, "up")
            while "sd_notify queue full; retrying 'READY=1'" not in caplog.text:
                await anyio.sleep(0.01)  # the event loop is not blocked by the retry
            while b"READY=1\nSTATUS=up" not in got:
                try:
                    got.append(sock.recv(4096))
                except BlockingIOError:
                    await anyio.wait_readable(sock)
    assert got.count(b"FILLER=1") == queued and b"WATCHDOG=1" not in got
    assert got[-1] == b"READY=1\nSTATUS=up"


async def test_a_queue_that_stays_full_is_given_up_after_the_bound(
    notify_socket: tuple[socket.socket, str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = notify_socket
    monkeypatch.setattr(notify, "RETRY_FOR_S", 0.2)
    _fill(path)
    with anyio.fail_after(10):
        await Notifier(path).stopping()
    assert "sd_notify queue still full after 0.2 s; gave up 'STOPPING=1'" in caplog.text


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    n = Notifier(str(tmp_path / "x.sock"))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert n.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert n.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert n.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert n.watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_PID")
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert n.watchdog_interval() is None


async def test_watchdog_loop_pings_at_the_interval(
    notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = notify_socket
    sock.setblocking(False)
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # ping every 0.1 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    n = Notifier(path)
    stamps: list[float] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(run_watchdog, n)
            while len(stamps) < 6:
                await anyio.wait_readable(sock)
                assert sock.recv(4096) == b"WATCHDOG=1"
                stamps.append(time.monotonic())
            tg.cancel_scope.cancel()
    # Six pings arrived within the deadline, in order (their pace is not timed here: the
    # machine is shared; the interval itself is half of WATCHDOG_USEC, as sd_notify asks).
    assert stamps == sorted(stamps) and len(stamps) == 6


async def test_watchdog_loop_returns_when_not_configured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(run_watchdog, Notifier(str(tmp_path / "n.sock")))
        await run_watchdog(Notifier(""))


def test_scrub_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/x")
    monkeypatch.setenv("WATCHDOG_USEC", "1")
    monkeypatch.setenv("LISTEN_FDS", "1")
    scrub_environment()
    assert "NOTIFY_SOCKET" not in os.environ
    assert "WATCHDOG_USEC" not in os.environ
    assert "LISTEN_FDS" not in os.environ


def test_listen_fds_ignores_other_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    monkeypatch.setenv("LISTEN_FDS", "1")
    assert listen_fds() == []
    monkeypatch.delenv("LISTEN_PID")
    assert listen_fds() == []


_CHILD = r"""
import os, socket, sys
from toolatlas.notify import listen_fds
socks = listen_fds()
assert "LISTEN_FDS" not in os.environ and listen_fds() == []
print(len(socks), socks[0].family == socket.AF_UNIX, socks[0].type == socket.SOCK_STREAM, flush=True)
conn, _ = socks[0].accept()
conn.sendall(b"hello from activated child")
conn.close()
"""


def test_listen_fds_in_a_socket_activated_child(tmp_path: Path) -> None:
    """A child started the way systemd does it (fd 3, LISTEN_PID = its own pid) accepts on fd 3."""
    path = str(tmp_path / "act.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    fd = listener.fileno()
    # Like systemd: the listening socket at fd 3 and LISTEN_PID set to the pid that execs.
    launcher = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3);"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1');"
        "os.execv(sys.executable, [sys.executable, '-c', sys.argv[2]])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, str(fd), _CHILD],
        pass_fds=[fd],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["1", "True", "True"]
        listener.close()  # the child holds its own copy
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(10)
            c.connect(path)
            assert c.recv(100) == b"hello from activated child"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
