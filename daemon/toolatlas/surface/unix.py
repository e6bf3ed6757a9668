"""The daemon's Unix socket: accept loop, one handler task per connection, peer credentials.

Also `unix_client(path)`: a transport for the SDK `Client` over the same socket (tests, benches).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from toolatlas.errors import ConfigError
from toolatlas.gateway.ports import DEFAULT_ENDPOINT, Connection, new_connection_id
from toolatlas.backoff import backoff_delay
from toolatlas.surface.admin import AdminLane
from toolatlas.surface.server import CONNECTION, Connections, init_options
from toolatlas.surface.sockstream import TransportStream
from toolatlas.surface.rpccheck import Refusal
from toolatlas.surface.wire import ndjson_streams

if TYPE_CHECKING:
    from mcp.server.lowlevel.server import Server

log = logging.getLogger(__name__)

# A failed accept() (EMFILE, ENFILE, ENOBUFS) is retried after a backoff between these.
ACCEPT_RETRY_BASE_S = 0.05
ACCEPT_RETRY_CAP_S = 2.0
# Seconds between log lines about refused connections (a cap reached).
REFUSAL_LOG_INTERVAL = 10.0
# A refused connection is kept this long at most, and this many reads, for its peer to close;
# past REFUSALS_LINGERING such connections at once, the next ones are closed at once (a peer
# hammering a full socket must not hold the daemon's descriptors).
REFUSAL_LINGER_S = 2.0
REFUSAL_READS = 16
REFUSALS_LINGERING = 64
# How often the daemon checks that its socket file is still there (_keep_socket_file).
SOCKET_CHECK_S = 2.0



def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the peer, from the kernel (SO_PEERCRED)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", raw)


SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; Python's socket module lacks the name


def peer_groups(sock: socket.socket) -> tuple[int, ...] | None:
    """The peer process's supplementary groups when it connected, from the kernel
    (SO_PEERGROUPS); None where the kernel cannot say (then access rules read /etc/group)."""
    for room in (256, 65536):  # gids; NGROUPS_MAX is 65536
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * room)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                continue
            return None
        return struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    return None


def prepare_socket_path(path: str) -> None:
    """Create the parent folder and remove a stale socket file; refuse to steal a live one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"socket path {path!r} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            log.info("removing stale socket %s", path)
            p.unlink(missing_ok=True)
            return
        raise
    else:
        raise ConfigError(f"another daemon is already listening on {path!r}")
    finally:
        probe.close()


def set_permissions(path: str, mode: int, owner: str | None, group: str | None) -> None:
    """A socket file's mode, owner and group; ConfigError naming the key when the owner or
    group is unknown here or may not be given the file by this user. A socket file that is
    gone (a /tmp cleaner: a reload in the moments before `_keep_socket_file` binds it again,
    or while it cannot) gets them when it is bound again; that is no error."""
    uid = gid = -1
    if owner or group:
        import grp
        import pwd

        try:
            uid = pwd.getpwnam(owner).pw_uid if owner else -1
        except KeyError:
            raise ConfigError(f"[daemon] socket_owner {owner!r}: no such user on this host") from None
        try:
            gid = grp.getgrnam(group).gr_gid if group else -1
        except KeyError:
            raise ConfigError(f"[daemon] socket_group {group!r}: no such group on this host") from None
    try:
        os.chmod(path, mode)
        if owner or group:
            os.chown(path, uid, gid)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise ConfigError(f"[daemon] socket_owner/socket_group: cannot give {path} to "
                          f"{owner or '(unchanged)'}:{group or '(unchanged)'}: {exc.strerror or exc}") from exc


class UnixServer:
    """Serves `server` on a Unix socket; `connections` lists the live ones."""

    def __init__(
        self,
        server: "Server[Any]",
        path: str,
        *,
        mode: int = 0o660,
        owner: str | None = None,
        group: str | None = None,
        max_message_bytes: int = 4 * 1024 * 1024,
        max_clients: int = 1024,
        max_clients_per_uid: int = 256,
        message_timeout: float | None = 30.0,
        idle_timeout: float = 0.0,
        on_bad_message: Any = None,
        fast_lane: Any = None,
        listen_socket: socket.socket | None = None,
        connections: Connections | None = None,
        admin: AdminLane | None = None,
        endpoint: str = DEFAULT_ENDPOINT,
    ) -> None:
        """`endpoint`: the name its connections carry ([[endpoint]], or the default)."""
        self.endpoint = endpoint
        self.server = server
        self.path = path
        self.mode = mode
        self.owner = owner
        self.group = group
        self.max_message_bytes = max_message_bytes
        self.max_clients = max_clients
        self.max_clients_per_uid = max_clients_per_uid
        self.message_timeout = message_timeout
        self.idle_timeout = idle_timeout
        self.on_bad_message = on_bad_message
        self.fast_lane = fast_lane  # see surface.server.fast_lane
        self.admin = admin  # the operator commands (surface.admin); on this socket only
        # A listening socket handed over by systemd socket activation (it owns the file).
        self.listen_socket = listen_socket
        # Shared with the HTTP endpoint: catalog_status counts every client.
        self.connections = connections if connections is not None else Connections()
        self._listener: anyio.abc.Listener[Any] | None = None
        self._stopping = False
        self._refused = 0  # connections refused since the last log line about them
        self._refusal_logged_at = -REFUSAL_LOG_INTERVAL
        self._lingering = 0  # refused connections waiting for their peer to close (_refuse)

    def __repr__(self) -> str:
        return f"<UnixServer {self.path} connections={len(self.connections)}>"

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self.listen_socket is not None:
            self._listener = await anyio.abc.SocketListener.from_socket(self.listen_socket)
            log.info("serving on a socket passed by systemd (%s)", self.listen_socket.getsockname())
        else:
            try:
                prepare_socket_path(self.path)
                self._listener = await self._bind()
            except OSError as exc:  # its folder cannot be made or written: one line, not a traceback
                why = f"{exc.filename} is not a folder" if isinstance(exc, FileExistsError) else (
                    f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
                raise ConfigError(f"cannot listen on the socket {self.path!r}: {why}") from exc
            log.info("listening on %s (mode %o)", self.path, self.mode)
        task_status.started()
        try:
            async with anyio.create_task_group() as tg, anyio.create_task_group() as watch:
                if self.listen_socket is None:
                    watch.start_soon(self._keep_socket_file)
                while True:  # a new listener when the socket file was removed (_keep_socket_file)
                    listener = self._listener
                    await self._accept_loop(listener, tg)
                    if self._stopping or self._listener is listener:
                        break
                watch.cancel_scope.cancel()
        finally:
            with anyio.move_on_after(1, shield=True):
                await self._listener.aclose()
            if self.listen_socket is None:
                Path(self.path).unlink(missing_ok=True)

    async def _bind(self) -> anyio.abc.Listener[Any]:
        listener = await anyio.create_unix_listener(self.path)
        try:
            self._apply_permissions()
        except BaseException:
            await listener.aclose()
            raise
        return listener

    async def _keep_socket_file(self) -> None:
        """Listen on the socket path again when its file is removed while the daemon runs (a
        /tmp cleaner, a stray `rm`): clients connect by path, and none could reach this daemon
        any more, while a `shim --config` finds the start lock held and waits in vain. A file
        that another process put in its place is left alone."""
        while True:
            await anyio.sleep(SOCKET_CHECK_S)
            if os.path.lexists(self.path) or self._stopping:
                continue
            try:
                prepare_socket_path(self.path)  # its folder may be gone too
                listener = await self._bind()
            except (OSError, ConfigError) as exc:
                log.warning("the socket file %s was removed, and binding it again failed: %s", self.path, exc)
                continue
            if self._stopping:
                await listener.aclose()
                return
            log.warning("the socket file %s was removed while the daemon runs; listening on it again", self.path)
            old, self._listener = self._listener, listener
            if old is not None:
                await old.aclose()  # its accept loop ends, and run() goes on with the new one

    async def _accept_loop(self, listener: Any, tg: anyio.abc.TaskGroup) -> None:
        """Accept until `stop_accepting()`. A failed accept (out of file descriptors, out of
        memory for a socket buffer) is logged and retried with backoff: the listener, and
        the socket file, stay, and accepting resumes once descriptors are free again."""
        failures = 0
        while True:
            try:
                stream = await listener.accept()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
                if self._stopping or isinstance(exc, anyio.ClosedResourceError):
                    return  # stop_accepting(): live connections go on until cancelled
                # anyio reports a failed accept(2) (EMFILE...) as BrokenResourceError from it
                cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
                failures += 1
                delay = backoff_delay(failures, base=ACCEPT_RETRY_BASE_S, cap=ACCEPT_RETRY_CAP_S)
                log.warning("accept on %s failed (%s, %d in a row); retrying in %.2f s", self.path,
                            getattr(cause, "strerror", None) or cause, failures, delay)
                await anyio.sleep(delay)
                continue
            if failures:
                log.info("accepting on %s again after %d failed attempts", self.path, failures)
                failures = 0
            tg.start_soon(self._handle, stream)

    def _apply_permissions(self) -> None:
        set_permissions(self.path, self.mode, self.owner, self.group)

    def reconfigure(
        self, *, mode: int, owner: str | None, group: str | None, max_message_bytes: int,
        max_clients: int, max_clients_per_uid: int, message_timeout: float | None, idle_timeout: float = 0.0,
    ) -> None:
        """Apply reloaded socket settings: the file's mode and ownership at once (a tightened
        mode shuts out new peers that it no longer admits); the line limit, the connection
        caps and the message timeout for new connections. ConfigError (`_apply_permissions`)
        leaves every setting as it was."""
        before = (self.mode, self.owner, self.group)
        self.mode, self.owner, self.group = mode, owner, group
        if self.listen_socket is None and self._listener is not None:
            try:
                self._apply_permissions()
            except ConfigError:
                self.mode, self.owner, self.group = before
                with contextlib.suppress(ConfigError, OSError):
                    self._apply_permissions()
                raise
        self.max_message_bytes = max_message_bytes
        self.max_clients, self.max_clients_per_uid = max_clients, max_clients_per_uid
        self.message_timeout, self.idle_timeout = message_timeout, idle_timeout

    async def stop_accepting(self) -> None:
        """Close the listening socket; live connections go on."""
        self._stopping = True
        if self._listener is not None:
            await self._listener.aclose()
            if self.listen_socket is None:
                Path(self.path).unlink(missing_ok=True)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:  # anyio's UNIXSocketStream
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        creds = peer_credentials(raw)
        conn = Connection(id=new_connection_id(), endpoint=self.endpoint)
        if creds:
            conn.pid, conn.uid, conn.gid = creds
            conn.groups = peer_groups(raw)
        refusal = self._over_cap(conn)
        if refusal is not None:
            self._log_refusal(conn, refusal)
            self._lingering += 1
            try:
                await _refuse(stream, Refusal(-32000, refusal).line(), self._lingering <= REFUSALS_LINGERING)
            finally:
                self._lingering -= 1
            return
        self.connections.add(conn)
        token = CONNECTION.set(conn)
        log.debug("client connected: %s", conn)
        try:
            moved = await TransportStream.adopt(stream)  # per message: no loop trips, no poll handles
            async with moved, ndjson_streams(
                moved, max_bytes=lambda: self.max_message_bytes, on_bad_message=self.on_bad_message,
                fast_lane=self.fast_lane, message_timeout=self.message_timeout,
                idle_timeout=self.idle_timeout,
                admin=functools.partial(self.admin, conn) if self.admin is not None else None,
            ) as (read, write):
                # Options per connection: a reload may have changed the instructions.
                await self.server.run(read, write, init_options(self.server))
        except Exception:
            log.exception("connection %d ended with an error", conn.id)
        finally:
            CONNECTION.reset(token)
            self.connections.discard(conn)
            log.debug("client disconnected: %d", conn.id)

    def _log_refusal(self, conn: Connection, reason: str) -> None:
        """A warning for the first refusal, then one count every REFUSAL_LOG_INTERVAL seconds:
        a peer hammering a full socket must not flood the log."""
        self._refused += 1
        now = time.monotonic()
        if now < self._refusal_logged_at + REFUSAL_LOG_INTERVAL:
            return
        log.warning("refused %d client connection(s) since the last report; the latest (pid %s, uid %s): %s",
                    self._refused, conn.pid, conn.uid, reason)
        self._refused, self._refusal_logged_at = 0, now

    def _over_cap(self, conn: Connection) -> str | None:
        """Why `conn` may not be served (a connection cap reached), else None."""
        unix = [c for c in self.connections if c.token is None and c.oauth is None]
        if len(unix) >= self.max_clients:
            return f"the daemon serves at most {self.max_clients} socket clients at once ([daemon] max_clients)"
        if conn.uid is not None and sum(1 for c in unix if c.uid == conn.uid) >= self.max_clients_per_uid:
            return (f"uid {conn.uid} already has {self.max_clients_per_uid} connections open "
                    "([daemon] max_clients_per_uid); close one and retry")
        return None


async def _refuse(stream: anyio.abc.SocketStream, line: bytes, linger: bool) -> None:
    """Send `line` and close; with `linger`, read what the peer sends meanwhile (for
    REFUSAL_LINGER_S at most). A client writes its initialize as soon as it connects: closed
    at once, the socket would meet that write with EPIPE, or be reset with it unread and lose
    `line` on its way."""
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
        async with stream:
            with anyio.move_on_after(REFUSAL_LINGER_S if linger else 1):
                await stream.send(line)
                await stream.send_eof()
                for _ in range(REFUSAL_READS if linger else 0):
                    await stream.receive()  # dropped; EndOfStream once the peer has read and closed


@asynccontextmanager
async def unix_client(path: str, *, max_bytes: int = 64 * 1024 * 1024) -> AsyncIterator[tuple[Any, Any]]:
    """A transport for `mcp.Client(unix_client(path))`."""
    stream = await TransportStream.adopt(await anyio.connect_unix(path))
    async with stream, ndjson_streams(stream, max_bytes=max_bytes) as streams:
        yield streams
