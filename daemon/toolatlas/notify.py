"""systemd integration without libsystemd: sd_notify, the watchdog loop and socket activation.

`Notifier` speaks the notify protocol (newline-separated `KEY=VALUE` datagrams) to the
AF_UNIX socket named by `$NOTIFY_SOCKET`; a leading `@` names an abstract socket. With no
socket configured every method is a no-op, so the daemon calls them unconditionally.

Sending never blocks the event loop: the datagram socket is non-blocking. A full receive
queue (systemd busy, or nobody reading yet) is retried with capped backoff for the state
changes systemd acts on (`ready`, `reloading`, `stopping`, which are awaited), so READY=1 is
not lost; a periodic `watchdog`/`status` line is sent once and dropped when there is no
room (the next one supersedes it). A message is given up only after `RETRY_FOR_S`.

Protocol reminders (see sd_notify(3)): after `reloading()` the service must send `ready()`
again once the new configuration is live; `WATCHDOG=1` must arrive within `WatchdogSec`,
so `run_watchdog` pings every half interval, from the event loop, which means a wedged loop
stops the pings and systemd restarts the service, which is the point.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import anyio
from anyio.abc import TaskStatus

from toolatlas.backoff import backoff_delay

logger = logging.getLogger(__name__)

# The first fd systemd passes with socket activation (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3

# How long a state change waits for room in a full notify queue before it is given up,
# and the backoff between attempts (seconds).
RETRY_FOR_S = 10.0
RETRY_BASE_S = 0.005
RETRY_CAP_S = 0.5

# Variables the service manager sets for this process only; children (stdio upstreams)
# must not inherit them (see `scrub_environment`).
_SYSTEMD_VARS = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
)


def _address(path: str) -> str | None:
    """Map `$NOTIFY_SOCKET` to a socket address; None for a form we cannot speak."""
    if path.startswith("@"):
        return "\0" + path[1:]
    if path.startswith("/"):
        return path
    # systemd >= 254 also allows vsock:CID:PORT; toolatlas runs on the host, not in a VM.
    return None


class Notifier:
    """sd_notify client for `$NOTIFY_SOCKET` (or an explicit path); no-op when unset.

    `enabled` is True when a usable socket address is configured. Errors while sending
    are logged and swallowed: losing a status line must never take the daemon down. The
    state changes (`ready`, `reloading`, `stopping`) are coroutines: they wait (bounded) for
    room in a full queue instead of dropping the message.
    """

    def __init__(self, socket_path: str | None = None) -> None:
        path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET", "")
        self._path = path
        self._address = _address(path) if path else None
        if path and self._address is None:
            logger.warning("NOTIFY_SOCKET=%r is not an AF_UNIX address; sd_notify disabled", path)
        self.enabled: bool = self._address is not None

    def __repr__(self) -> str:
        return f"<Notifier socket={self._path!r} enabled={self.enabled}>"

    def _send(self, message: str) -> bool:
        """One attempt; False only when the receive queue is full (worth retrying).

        Other errors (no listener, permission) are logged and count as done: losing a status
        line must never take the daemon down.
        """
        if self._address is None:
            return True
        # A socket per message, as libsystemd does: nothing to close, nothing to leak.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto(message.encode(), self._address)
        except BlockingIOError:
            return False
        except OSError as exc:
            logger.warning("sd_notify to %s failed: %s", self._path, exc)
        return True

    def _send_once(self, message: str) -> None:
        if not self._send(message):
            logger.debug("sd_notify queue full; dropped %r", _first_line(message))

    async def _deliver(self, message: str) -> None:
        """Send `message`, retrying a full queue with capped backoff for up to RETRY_FOR_S."""
        deadline = anyio.current_time() + RETRY_FOR_S
        attempt = 0
        while not self._send(message):
            attempt += 1
            delay = backoff_delay(attempt, base=RETRY_BASE_S, cap=RETRY_CAP_S)
            if anyio.current_time() + delay > deadline:
                logger.warning("sd_notify queue still full after %g s; gave up %r", RETRY_FOR_S, _first_line(message))
                return
            log = logger.warning if attempt == 1 else logger.debug
            log("sd_notify queue full; retrying %r in %.3f s (attempt %d)", _first_line(message), delay, attempt)
            await anyio.sleep(delay)
        if attempt:
            logger.info("sd_notify %r delivered after %d retries", _first_line(message), attempt)

    async def ready(self, status: str = "") -> None:
        """READY=1: the socket accepts and search serves (the first index is built, BM25 at
        least: the embedding model may still be loading); also after a reload."""
        await self._deliver("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    async def stopping(self) -> None:
        """STOPPING=1: shutdown has begun."""
        await self._deliver("STOPPING=1")

    async def reloading(self) -> None:
        """RELOADING=1 with the CLOCK_MONOTONIC timestamp systemd requires (Type=notify-reload).

        The timestamp is taken at the first attempt; a retried message keeps it.
        """
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        await self._deliver(f"RELOADING=1\nMONOTONIC_USEC={usec}")

    def watchdog(self) -> None:
        """WATCHDOG=1: the event loop is alive (once; the next ping supersedes a dropped one)."""
        self._send_once("WATCHDOG=1")

    def status(self, text: str) -> None:
        """STATUS=...: a one-line human status shown by `systemctl status` (sent once)."""
        self._send_once(f"STATUS={_one_line(text)}")

    def extend_timeout(self, seconds: float) -> None:
        """EXTEND_TIMEOUT_USEC: ask for `seconds` more before the start/stop timeout fires.

        For a slow first index build (embedding thousands of tools) during startup; repeat
        it while progress is being made.
        """
        self._send_once(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1_000_000))}")

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of `$WATCHDOG_USEC`), or None.

        None when notifications are disabled, the watchdog is off, the value is not a
        positive integer, or `$WATCHDOG_PID` names another process (the variable leaked
        from a parent).
        """
        if not self.enabled:
            return None
        raw = os.environ.get("WATCHDOG_USEC", "")
        try:
            usec = int(raw)
        except ValueError:
            if raw:
                logger.warning("WATCHDOG_USEC=%r is not an integer; watchdog off", raw)
            return None
        if usec <= 0:
            return None
        pid = os.environ.get("WATCHDOG_PID", "")
        if pid:
            try:
                if int(pid) != os.getpid():
                    return None
            except ValueError:
                return None
        return usec / 2 / 1_000_000


def _first_line(message: str) -> str:
    return message.split("\n", 1)[0]


def _one_line(text: str) -> str:
    # A newline would start a new KEY=VALUE assignment in the datagram.
    return " ".join(text.splitlines())


def scrub_environment() -> None:
    """Remove systemd's per-process variables from `os.environ`.

    Call after creating the `Notifier`, `listen_fds()` and reading the watchdog interval,
    before spawning stdio upstreams, so that a child never talks to our notify socket or
    mistakes our listening sockets for its own. Idempotent.
    """
    for var in _SYSTEMD_VARS:
        os.environ.pop(var, None)


def listen_fds() -> list[socket.socket]:
    """Sockets passed by systemd socket activation (`$LISTEN_FDS`, fds from 3), else [].

    Honoured only when `$LISTEN_PID` is this process. The variables are removed from the
    environment afterwards, so a second call returns [] instead of wrapping the same fds
    twice, and children do not inherit them. Each fd is made close-on-exec.
    """
    try:
        pid = int(os.environ.get("LISTEN_PID", ""))
        count = int(os.environ.get("LISTEN_FDS", ""))
    except ValueError:
        return []
    if pid != os.getpid() or count <= 0:
        return []
    for var in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    socks = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)
        socks.append(socket.socket(fileno=fd))
    return socks


async def run_watchdog(
    notifier: Notifier, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Send WATCHDOG=1 every `notifier.watchdog_interval()` seconds until cancelled.

    Returns at once (after signalling started) when the watchdog is not configured.
    """
    interval = notifier.watchdog_interval()
    task_status.started()
    if interval is None:
        return
    logger.info("systemd watchdog: pinging every %.3g s", interval)
    while True:
        notifier.watchdog()
        await anyio.sleep(interval)
