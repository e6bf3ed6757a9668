"""Stdio children: how the daemon spawns one, drives its pipes, stops it, and starts them early.

Every stdio upstream is spawned by `spawn` (pipes on all three streams, its own session, the
environment of `child_environment`) and driven through `ChildProcess`, the anyio process the
stdio transport expects. Its exit status is polled (waitpid WNOHANG), never waited for by a
thread or the event loop's child watcher.

Starting early: `toolatlas serve` spends about two seconds on its own imports (mcp and its
types, numpy, the gateway) before the pool starts a stdio upstream, and the child then spends
its own seconds starting (an interpreter or node, and its imports) before it can answer
`initialize`. Each is mostly one core's work, so the CLI spawns every enabled stdio upstream
once the config is read (`prespawn`, before the heavy imports), and the pool's first start
of that upstream takes the waiting child (`take`) instead of spawning another: the two
starts overlap. A child is taken only when its argv, environment and working directory are
exactly what the pool would spawn and it still runs; otherwise it is stopped and the pool
spawns as before (and reports any failure as before). Restarts always spawn. A child nobody
took is stopped by `discard` (the daemon calls it once its upstreams have started), at exit,
or by a SIGTERM that comes before the daemon took SIGTERM over. Nothing is spawned early
when a daemon already answers on the configured socket: that start fails anyway.

Imports: the standard library, anyio and the config only (it runs before everything else).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import IO

import anyio
import anyio.abc
import anyio.lowlevel

from toolatlas.config import StdioUpstream
from toolatlas.paths import socket_answers

logger = logging.getLogger(__name__)

# What a stdio child inherits of the daemon's environment (the SDK's stdio default), besides
# its own `env`: no secrets of the daemon's leak into an upstream.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
_POLL_S = 0.01
_EXIT_POLL_S = 1.0  # `exited` without a pidfd
_STOP_WAIT_S = 2.0
# Seconds a stdio child gets to exit by itself after its stdin closes, then after SIGTERM.
STDIN_CLOSE_GRACE = 2.0
SIGTERM_GRACE = 2.0


def child_environment(up: StdioUpstream) -> dict[str, str]:
    """The environment a stdio upstream runs with: INHERITED_ENV (shell functions left out)
    and the upstream's own `env` over it."""
    env = {key: value for key in INHERITED_ENV
           if (value := os.environ.get(key)) is not None and not value.startswith("()")}
    return env | dict(up.env)


class SpawnError(OSError):
    """A stdio child that could not be started, said as a sentence naming the command (or
    the cwd) and what is wrong with it; str() is that sentence."""


def spawn(up: StdioUpstream) -> subprocess.Popen[bytes]:
    """Start `up` the one way the daemon starts a stdio child: pipes on all three streams and
    its own session (a process group the shutdown signals as a whole). Raises SpawnError."""
    try:
        return subprocess.Popen(
            [up.command, *up.args], env=child_environment(up), cwd=up.cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise SpawnError(_why_not_started(up, exc)) from exc


def _why_not_started(up: StdioUpstream, exc: OSError) -> str:
    """What the OSError of starting `up` means, for status and logs: the bare errno said "No
    such file or directory: 'npx'" without the PATH searched (a service's PATH is not the
    login shell's) and without telling a missing command from a missing cwd."""
    cmd = up.command
    if up.cwd is not None and exc.filename == up.cwd:  # subprocess names the cwd when chdir failed
        what = "is not a folder" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else f"cannot be entered ({exc.strerror})"
        return f"its cwd {up.cwd!r} {what}; create it, or fix `cwd` in the config"
    if exc.errno == errno.ENOENT and "/" not in cmd:
        path = child_environment(up).get("PATH", os.defpath)
        return (f"command {cmd!r} is not found on the PATH it gets ({path[:200]}); install it, give its "
                "absolute path as `command`, or set PATH in the upstream's `env`")
    if exc.errno == errno.ENOENT:
        return f"command {cmd!r} does not exist; install it, or fix `command` in the config"
    if exc.errno == errno.EACCES:
        what = "a folder" if os.path.isdir(cmd) else "not executable (chmod +x it)"
        return f"command {cmd!r} is {what}"
    if exc.errno == errno.ENOEXEC:
        return f"command {cmd!r} is not a program this system can run (a script needs a '#!' first line)"
    return f"command {cmd!r} could not be started: {exc.strerror or exc}"


_Key = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...], str | None]
_waiting: dict[str, tuple[_Key, subprocess.Popen[bytes]]] = {}
_HELD = (signal.SIGINT, signal.SIGTERM)
_deferred: list[int] = []  # of _HELD, what came during a spawn: sent again once the child is recorded


def _key(up: StdioUpstream) -> _Key:
    return up.command, tuple(up.args), tuple(sorted(child_environment(up).items())), up.cwd


def prespawn(upstreams: Sequence[object], socket_path: str) -> list[str]:
    """Spawn the stdio upstreams among `upstreams` (enabled ones) to be taken by `take`;
    returns their names. A spawn that fails is left to the pool's own start to report.

    A SIGINT or SIGTERM that comes during a spawn is held until the child is in `_waiting`,
    then sent again: acted on between the fork and the record, it lost the child (a Ctrl-C's
    KeyboardInterrupt raised inside Popen; a SIGTERM before its handler was in place), which
    then outlived the daemon."""
    if socket_answers(socket_path, timeout=0.5):
        return []
    early = [up for up in upstreams if isinstance(up, StdioUpstream) and up.enabled and up.name not in _waiting]
    if early and not _waiting:
        atexit.register(discard)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _stop_children_then_die)
    for up in early:
        held = {sig: signal.signal(sig, _hold) for sig in _HELD}
        try:
            _waiting[up.name] = (_key(up), spawn(up))
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
        finally:
            for sig, handler in held.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        while _deferred:
            os.kill(os.getpid(), _deferred.pop(0))  # to its own handler now
    return list(_waiting)


def _hold(signum: int, _frame: object) -> None:
    if signum not in _deferred:
        _deferred.append(signum)


def _stop_children_then_die(signum: int, _frame: object) -> None:
    """SIGTERM until the daemon takes it over (app.serve, after its imports): its default
    action ended the daemon without atexit, leaving the early children running (one that
    does not read its stdin never notices). They are stopped, then the signal acts as before."""
    discard()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def take(up: StdioUpstream) -> subprocess.Popen[bytes] | None:
    """The child prespawned for `up`, if it was spawned exactly as `up` says and still runs
    (it is then the caller's); else None (a stale one is stopped)."""
    item = _waiting.pop(up.name, None)
    if item is None:
        return None
    key, child = item
    if key != _key(up) or child.poll() is not None:
        _stop(child, at_once=True)  # never used: no grace owed, and this runs on the event loop
        return None
    return child


def discard() -> None:
    """Stop every prespawned child nobody took."""
    while _waiting:
        _name, (_key_, child) = _waiting.popitem()
        _stop(child)


def _stop(child: subprocess.Popen[bytes], *, at_once: bool = False) -> None:
    """Close its pipes, SIGTERM its group (SIGKILL after _STOP_WAIT_S, or at once) and reap it."""
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    for sig in (signal.SIGKILL,) if at_once else (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)
        try:
            child.wait(_STOP_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            continue


class _PipeReader(anyio.abc.ByteReceiveStream):
    """A child's stdout or stderr on the event loop (as anyio's own subprocess streams).

    `tap`, when set, is offered each chunk as it arrives while the reading task waits with
    nothing buffered; a chunk it returns True for is consumed there and never read. The
    stdio transport taps stdout for the raw relay's replies, which then reach their waiting
    call without first waking the reading task. Anything arriving while a chunk waits to be
    read is buffered behind it, so the order of what is read does not change."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
        self._reader = reader
        self._transport = transport
        self.tap: Callable[[bytes], bool] | None = None
        self._idle = False  # the reader waits in read() with nothing buffered

    def offer(self, data: bytes) -> bool:
        """Whether `tap` took `data` (else the caller buffers it for `receive`)."""
        if self._idle and self.tap is not None and self.tap(data):
            return True
        self._idle = False
        return False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        self._idle = True
        try:
            data = await self._reader.read(max_bytes)
        finally:
            self._idle = False
        if data:
            return data
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        self._reader.set_exception(anyio.ClosedResourceError())
        self._transport.close()
        await anyio.lowlevel.checkpoint()


class _PipeWriter(anyio.abc.ByteSendStream):
    """A child's stdin on the event loop (as anyio's own subprocess stream)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._closed = False

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            self._writer.write(item)
            await self._writer.drain()
        except (ConnectionResetError, BrokenPipeError, RuntimeError) as exc:
            # stdlib's drain() raises the first two once the pipe is gone; uvloop's write() the last.
            if self._closed:
                raise anyio.ClosedResourceError from exc
            if self._writer.is_closing():
                raise anyio.BrokenResourceError from exc
            raise

    async def aclose(self) -> None:
        self._closed = True
        self._writer.close()
        await anyio.lowlevel.checkpoint()


class ChildProcess(anyio.abc.Process):
    """A spawned child as the anyio process the stdio transport expects."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: _PipeWriter, stdout: _PipeReader,
                 stderr: _PipeReader) -> None:
        self._popen = popen
        self._stdin, self._stdout, self._stderr = stdin, stdout, stderr

    @classmethod
    async def attach(cls, popen: subprocess.Popen[bytes]) -> ChildProcess:
        """Attach `popen`'s pipes to the running event loop. On failure the child is stopped."""
        try:
            assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
            loop = asyncio.get_running_loop()
            out, err = await _reader(loop, popen.stdout), await _reader(loop, popen.stderr)
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, popen.stdin)
            writer = asyncio.StreamWriter(transport, protocol, None, loop)
            return cls(popen, _PipeWriter(writer), out, err)
        except BaseException:
            _stop(popen, at_once=True)
            raise

    async def aclose(self) -> None:
        """Close the pipes and reap the child (as anyio's own processes do)."""
        with anyio.CancelScope(shield=True):
            for stream in (self._stdin, self._stdout, self._stderr):
                await stream.aclose()
        await self.wait()

    async def wait(self) -> int:
        while (code := self._popen.poll()) is None:
            await anyio.sleep(_POLL_S)
        return code

    async def exited(self) -> int:
        """The exit code once the child has exited, without waiting for its pipes to end (a
        process it started may hold them): its pidfd on the event loop, or where there is
        none a poll every _EXIT_POLL_S."""
        try:
            fd: int | None = os.pidfd_open(self._popen.pid)
        except (AttributeError, OSError):  # no pidfd_open here, or the child is reaped already
            fd = None
        try:
            while (code := self._popen.poll()) is None:
                if fd is None:
                    await anyio.sleep(_EXIT_POLL_S)
                else:
                    await anyio.wait_readable(fd)
            return code
        finally:
            if fd is not None:
                os.close(fd)

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    def send_signal(self, signal: int) -> None:
        self._popen.send_signal(signal)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def tap_stdout(self, tap: Callable[[bytes], bool] | None) -> None:
        """Offer stdout's chunks to `tap` first (`_PipeReader`); None stops it."""
        self._stdout.tap = tap

    @property
    def stdin(self) -> anyio.abc.ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr


async def _wait_exit(process: anyio.abc.Process, timeout: float) -> bool:
    # Poll returncode, not process.wait(): wait() also waits for pipe EOF, which a
    # grandchild holding the pipes can delay forever.
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(_POLL_S)
    return process.returncode is not None


async def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """Whether process group `pgid` is empty within `timeout` s (its child is reaped already)."""
    with anyio.move_on_after(timeout):
        while True:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # a member that changed its uid: nothing this daemon can stop
                return True
            await anyio.sleep(_POLL_S)
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_process(process: anyio.abc.Process, name: str) -> int | None:
    """Close stdin, wait, SIGTERM the group, wait, SIGKILL the group. Shielded and bounded.
    Returns the last signal it had to send the child, or None when it exited by itself."""
    sent: int | None = None
    with anyio.CancelScope(shield=True):
        pgid = process.pid  # start_new_session: the child leads its own group
        if process.stdin is not None:
            with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await process.stdin.aclose()
        if not await _wait_exit(process, STDIN_CLOSE_GRACE):
            logger.info("upstream %s: child %d ignored stdin close; sending SIGTERM", name, pgid)
            _signal_group(pgid, sent := signal.SIGTERM)
            if not await _wait_exit(process, SIGTERM_GRACE):
                logger.warning("upstream %s: child %d ignored SIGTERM; sending SIGKILL", name, pgid)
                _signal_group(pgid, sent := signal.SIGKILL)
                if not await _wait_exit(process, 2.0):
                    logger.error("upstream %s: child %d survived SIGKILL; abandoning it", name, pgid)
        # Leftover grandchildren in the child's group (npx -> node) must not outlive it, nor
        # one that ignores SIGTERM: the group gets SIGKILL once SIGTERM_GRACE has passed.
        _signal_group(pgid, signal.SIGTERM)
        if not await _wait_group_gone(pgid, SIGTERM_GRACE):
            logger.warning("upstream %s: a process child %d started ignored SIGTERM; sending SIGKILL", name, pgid)
            _signal_group(pgid, signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await stream.aclose()
    return sent


class _Protocol(asyncio.StreamReaderProtocol):
    """StreamReaderProtocol whose chunks are first offered to its `_PipeReader`'s tap."""

    pipe: _PipeReader | None = None

    def data_received(self, data: bytes) -> None:
        if self.pipe is not None and self.pipe.offer(data):
            return
        super().data_received(data)


async def _reader(loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> _PipeReader:
    reader = asyncio.StreamReader(loop=loop)
    protocol = _Protocol(reader, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: protocol, pipe)
    protocol.pipe = out = _PipeReader(reader, transport)
    return out


__all__ = ["INHERITED_ENV", "ChildProcess", "child_environment", "discard", "prespawn", "spawn", "SpawnError", "stop_process", "take"]
