"""`toolatlas shim`: relay an MCP client's stdio to the daemon's Unix socket, one JSON-RPC line
at a time, and survive the daemon going away.

Deliberately stdlib-only (no mcp, numpy or torch): MCP clients spawn it per session, so it
must start in a few tens of milliseconds. One thread and a poll loop: whole lines pass
through unchanged; the shim reads only what it must to resume the session on a new
connection (surface.resume: ids in flight, the handshake, open listen streams).

When the daemon goes (a restart, a crash, `systemctl restart`), the shim errors the requests
in flight, answers new ones with "restarting, retry", reconnects with backoff, replays the
session and tells the client to refetch its tools. It exits only when the client closes its
stdin (or stdout), or when it never reached a daemon and has no config to start one with.
With `--config` (`autostart.Starter`) it starts the daemon itself when nothing answers.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import select
import selectors
import socket
import stat
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toolatlas.backoff import backoff_delay
from toolatlas.jsonlines import INVALID_REQUEST, BoundedLines, Oversized, Refusal
from toolatlas.paths import SOCKET_PATH_MAX, file_kind
from toolatlas.surface.resume import Link, Out, Session

if TYPE_CHECKING:
    from toolatlas.surface.autostart import Starter

CONNECT_WAIT_S = 5.0  # without --config: how long the first connection is waited for
CONNECT_TIMEOUT_S = 1.0  # one connect(2) (a full listen backlog blocks it)
RETRY_BASE_S, RETRY_CAP_S = 0.05, 0.5  # reconnect backoff (a Unix connect costs microseconds)
HEALTHY_S = 5.0  # a connection that lasted this long resets the backoff (one dropped at once does not)
HANDSHAKE_WAIT_S = 60.0  # with --config: how long the client's first handshake is held
RESPAWN_AFTER_S = 5.0  # with --config: a lost daemon silent this long is started again
GONE_AFTER_S = 10.0  # a lost daemon silent this long is not said to be restarting any more
CLIENT_LINE_LIMIT = 64 * 1024 * 1024
DAEMON_LINE_LIMIT = 256 * 1024 * 1024
OUTBOX_HIGH = 16 * 1024 * 1024  # stop reading the client while this much waits for the daemon
_CHUNK = 65536


def connect(path: str, wait: float = CONNECT_WAIT_S) -> socket.socket:
    """Connect to the daemon, waiting briefly in case it is just starting."""
    deadline = time.monotonic() + wait
    attempt = 0
    while True:
        try:
            return _connect_once(path)
        except OSError as exc:
            if wrong := _unusable(path, exc):  # waiting helps nothing
                raise SocketUnusable(wrong) from exc
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"cannot reach the toolatlas daemon at {path}: {exc.strerror or exc}. "
                    "Is `toolatlas serve` running, and is this the right --socket? "
                    "(`toolatlas shim --config PATH` starts the daemon when it is not running)"
                ) from exc
            attempt += 1
            time.sleep(backoff_delay(attempt, base=0.02, cap=0.25, jitter=0.0))


class SocketUnusable(ConnectionError):
    """Connecting to the path cannot work however long one waits (no socket there, or one closed
    to this user); the message says what to do, so no "is the daemon running?" belongs after it."""


# What a user the socket is closed to can do about it.
_NOT_YOURS = "join its group, or have the daemon's operator set [daemon] socket_mode or socket_group"


def _unusable(path: str, exc: OSError) -> str | None:
    """Why connecting to `path` cannot work however long one waits, where connect(2)'s own
    word misleads: something other than a socket there (a config file or a folder given as
    --socket: "Connection refused"), or a socket or folder closed to this user ("Permission
    denied" read as "is toolatlas serve running?"). None when nothing is there or it is a
    socket nobody listens on (a daemon that is not running, or still starting)."""
    if (size := len(os.fsencode(path))) > SOCKET_PATH_MAX:  # connect(2): "AF_UNIX path too long"
        return (f"{path}: {size} bytes long, and a Unix socket path holds at most {SOCKET_PATH_MAX}, so no daemon "
                "listens there: point --socket, $TOOLATLAS_SOCKET or the config's [daemon] socket at a shorter one")
    try:
        st = os.stat(path)
    except PermissionError:
        return f"{path}: permission denied: a folder on its path is closed to this user; {_NOT_YOURS}"
    except (OSError, ValueError):
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return (f"{path} is {file_kind(st.st_mode)}, not a socket: point --socket, $TOOLATLAS_SOCKET or the "
                "config's [daemon] socket at the daemon's socket")
    if isinstance(exc, PermissionError):
        return (f"{path}: permission denied: the socket (owner {_name(pwd.getpwuid, st.st_uid)}, group "
                f"{_name(grp.getgrgid, st.st_gid)}, mode {stat.S_IMODE(st.st_mode):04o}) is not open to this user; "
                f"{_NOT_YOURS}")
    return None


def _name(lookup: Callable[[int], Any], number: int) -> str:
    try:
        return f"{lookup(number)[0]}"
    except KeyError:
        return str(number)


def _connect_once(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _say(text: str) -> None:
    """One line on stderr, which MCP clients keep in the server's log."""
    try:
        print(f"toolatlas shim: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _gone(seconds: float, exc: OSError) -> str:
    """What a request is told, besides "restarting", when no daemon has answered for `seconds`:
    after GONE_AFTER_S, "retry in a few seconds" alone kept a model retrying for as long as
    no daemon came back."""
    if seconds < GONE_AFTER_S:
        return ""
    return f"nothing has answered there for {seconds:.0f} s ({exc.strerror or exc}): is `toolatlas serve` running?"


def _reader_gone(fd: int) -> bool:
    """Whether nobody reads `fd` any more: a pipe whose reader closed (POLLERR), a socket
    whose peer closed (POLLHUP). A peer that only half-closed, a file or a tty: False."""
    poller = select.poll()
    poller.register(fd, 0)  # only the conditions poll(2) always reports
    return any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in poller.poll(0))


class _ClientGone(Exception):
    """The client closed its end of stdout."""


class Shim:
    """The relay loop between fds `stdin`/`stdout` and the daemon socket at `path`."""

    def __init__(self, path: str, *, starter: Starter | None = None, stdin: int = 0, stdout: int = 1) -> None:
        self.path = path
        self.starter = starter
        self.stdin, self.stdout = stdin, stdout
        self.session = Session(path)
        self.sock: socket.socket | None = None
        self.sel = selectors.PollSelector()  # poll(2) also takes a regular file or /dev/null as stdin
        self.outbox = bytearray()
        self.client_lines = BoundedLines(CLIENT_LINE_LIMIT)
        self.daemon_lines = BoundedLines(DAEMON_LINE_LIMIT)
        self.client_eof = False
        self.reading_client = False
        self.attempt = 0
        self.next_try = 0.0
        self.down_since = time.monotonic()
        self.began = self.up_since = self.down_since

    def __repr__(self) -> str:
        return f"<Shim {self.path} {self.session!r} outbox={len(self.outbox)}>"

    def run(self, sock: socket.socket | None = None) -> int:
        """Relay until the client goes; `sock` is a connection already made."""
        try:
            if sock is not None:
                self._attach(sock)
            self._read_client(True)
            while True:
                timeout = None if self.session.link is Link.UP else max(0.0, self._next_deadline() - time.monotonic())
                # The daemon's side first: a drop seen in the same poll as a request makes
                # that request a "restarting" refusal rather than a write to a dead socket.
                for key, mask in sorted(self.sel.select(timeout), key=lambda km: km[0].data == "client"):
                    if key.data == "client":
                        self._on_client()
                    elif key.data == "stdout":  # (see _on_client)
                        if _reader_gone(self.stdout):
                            raise _ClientGone
                        self.sel.unregister(self.stdout)  # it cannot tell: the replies decide
                    elif key.fileobj is self.sock:
                        if mask & selectors.EVENT_WRITE:
                            self._flush()
                        if mask & selectors.EVENT_READ and self.sock is not None:
                            self._on_daemon()
                # A handshake held for a daemon being started is owed a reply too (_tick bounds it).
                if self.client_eof and not self.session.held and (
                        self.session.link is not Link.UP or not self.session.pending and not self.outbox):
                    return 0
                self._tick(time.monotonic())
        except _ClientGone:
            return 0
        except KeyboardInterrupt:
            return 130
        finally:
            if self.sock is not None:
                self.sock.close()

    # -- the client side -----------------------------------------------------------------------

    def _read_client(self, on: bool) -> None:
        if on == self.reading_client or self.client_eof:
            return
        if on:
            self.sel.register(self.stdin, selectors.EVENT_READ, "client")
        else:
            self.sel.unregister(self.stdin)
        self.reading_client = on

    def _on_client(self) -> None:
        try:
            data = os.read(self.stdin, _CHUNK)
        except OSError:
            data = b""
        for line in self.client_lines.feed(data, end=not data):  # EOF ends a last line
            if isinstance(line, Oversized):
                self._to_client([Refusal(INVALID_REQUEST, f"message exceeds the shim's {CLIENT_LINE_LIMIT}-byte limit "
                                         "and was discarded; send a smaller one", line.request_id).line()])
                continue
            if not line.strip():
                continue
            if self.session.link is Link.DOWN and self.sock is None:
                self._try_connect(time.monotonic())  # the daemon may be back: try before refusing
            self._apply(self.session.from_client(line))
        if not data:
            self._read_client(False)
            self.client_eof = True
            # A client that closed stdin may still read the replies it is owed, or may have
            # died mid-call: then its stdout has no reader (POLLERR, or POLLHUP for a socket),
            # and the shim goes at once, so the daemon cancels the calls upstream.
            self.sel.register(self.stdout, selectors.EVENT_READ, "stdout")
            if self.sock is not None and not self.outbox:
                self._shut_write()
            return
        if len(self.outbox) > OUTBOX_HIGH:
            self._read_client(False)  # the daemon reads slower than the client writes

    def _to_client(self, lines: list[bytes]) -> None:
        for line in lines:
            view = memoryview(line)
            while view:
                try:
                    n = os.write(self.stdout, view)
                except BrokenPipeError as exc:
                    raise _ClientGone from exc
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EINTR):
                        continue
                    raise _ClientGone from exc
                view = view[n:]

    def _apply(self, out: Out) -> None:
        if out.client:
            self._to_client(out.client)
        if out.daemon and self.sock is not None:
            for line in out.daemon:
                self.outbox += line
            self._flush()

    # -- the daemon side -----------------------------------------------------------------------

    def _attach(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.sel.register(sock, selectors.EVENT_READ)
        self.daemon_lines = BoundedLines(DAEMON_LINE_LIMIT)
        resumed = self.session.link is Link.DOWN
        self._apply(self.session.connected())
        if resumed:
            _say(f"reconnected to the daemon at {self.path} after {time.monotonic() - self.down_since:.1f} s; "
                 f"session resumed ({len(self.session.listens)} listen streams)")
        self.up_since = time.monotonic()

    def _on_daemon(self) -> None:
        assert self.sock is not None
        try:
            data = self.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc.strerror or str(exc))
            return
        if not data:
            self._lost("the daemon closed the connection")
            return
        out: list[bytes] = []
        for line in self.daemon_lines.feed(data):
            if isinstance(line, Oversized):
                out.append(Refusal(INVALID_REQUEST, f"the daemon's reply of {line.size} bytes exceeds the shim's "
                                   f"{DAEMON_LINE_LIMIT}-byte limit and was discarded", line.request_id).line())
                if line.request_id is not None:
                    self.session.settle(line.request_id)
            elif line.strip():
                out += self.session.from_daemon(line).client
        self._to_client(out)

    def _flush(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            while self.outbox:
                n = sock.send(self.outbox)
                del self.outbox[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._lost(exc.strerror or str(exc))
            return
        self.sel.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if self.outbox else 0))
        if len(self.outbox) <= OUTBOX_HIGH // 2:
            self._read_client(True)
        if self.client_eof and not self.outbox:
            self._shut_write()

    def _shut_write(self) -> None:
        """The client is done: tell the daemon, and wait for the replies still owed."""
        assert self.sock is not None
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _lost(self, cause: str) -> None:
        assert self.sock is not None
        self.sel.unregister(self.sock)
        self.sock.close()
        self.sock = None
        self.outbox.clear()
        self._read_client(True)
        self._to_client(self.session.lost(cause).client)
        now = time.monotonic()
        # A daemon that takes connections and drops them at once (a connection cap) must not
        # be reconnected to, and the client told to refetch, in a tight loop.
        self.attempt = 1 if now - self.up_since >= HEALTHY_S else self.attempt + 1
        self.down_since = now
        self.next_try = now + backoff_delay(self.attempt, base=RETRY_BASE_S, cap=RETRY_CAP_S)
        if not self.client_eof:
            _say(f"lost the daemon at {self.path} ({cause}); reconnecting")

    # -- reconnecting --------------------------------------------------------------------------

    def _next_deadline(self) -> float:
        if self.session.link is Link.DOWN and not self.session.resumable:
            return self.next_try + 3600.0  # nothing to resume: connect when the client asks
        if self.session.held:
            return min(self.next_try, self.began + HANDSHAKE_WAIT_S)
        return self.next_try

    def _tick(self, now: float) -> None:
        if self.session.link is Link.UP:
            return
        if self.session.held and now >= self.began + HANDSHAKE_WAIT_S:
            _say(f"no daemon answered at {self.path} within {HANDSHAKE_WAIT_S:.0f} s")
            self._apply(self.session.expire_held())
        if now >= self.next_try and (self.session.link is Link.STARTING or self.session.resumable):
            self._try_connect(now)

    def _try_connect(self, now: float) -> None:
        try:
            sock = _connect_once(self.path)
        except OSError as exc:
            self.attempt += 1
            self.next_try = now + backoff_delay(self.attempt, base=RETRY_BASE_S, cap=RETRY_CAP_S)
            self._maybe_start(now, exc)
            return
        self._attach(sock)

    def _maybe_start(self, now: float, exc: OSError) -> None:
        """With --config: start the daemon when nothing answers (at once before the first
        connection; after RESPAWN_AFTER_S once one was lost, so a supervisor that restarts
        it, systemd's Restart= for one, goes first)."""
        if (starter := self.starter) is None:  # nobody starts it here: after a while, say it may not run
            self.session.down_reason = _gone(now - self.down_since, exc)
            return
        code = starter.exited()
        if code is not None:
            self.session.down_reason = f"the daemon this shim started exited with status {code} (see {starter.log})"
            _say(self.session.down_reason)
            self._apply(self.session.expire_held())  # no point holding the client's handshake any longer
        if self.session.link is Link.DOWN and now - self.down_since < RESPAWN_AFTER_S:
            return
        from toolatlas.surface.autostart import StartFailed
        try:
            note = starter.start(exc)
        except StartFailed as failed:  # nothing answers until that is fixed: tell the client now
            self.session.down_reason = note = str(failed)
            self._apply(self.session.expire_held())
        if note:
            _say(note)


def run(path: str, starter: Starter | None = None) -> int:
    """The `toolatlas shim` command: 0 when the client goes, 1 when no daemon was ever
    reached and there is no config to start one with."""
    sock = None
    if starter is None:
        try:
            sock = connect(path)
        except ConnectionError as exc:
            _say(str(exc))
            return 1
    return Shim(path, starter=starter).run(sock)
