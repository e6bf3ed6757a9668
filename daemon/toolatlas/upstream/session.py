"""One upstream's owner task: connect, list, supervise, reconnect.

The owner task alone enters and exits the transport and the SDK `Client` (the SDK requires
one task); other tasks call tools through the entered client. Every await on the upstream
has a named timeout from `Upstream.timeouts`, raised as `UpstreamTimeout`.
`UpstreamSession` is the upstream across its life (state, status, reconnects, calls); each
connection attempt is one `Connection`, whose facts (client, loss, child) die with it.

A dead session is noticed four ways: the read stream ends (stdio child exit, SSE drop), a
call fails at the connection level (404 on a stale session id, refused connection), a
health check fails, or `subscriptions/listen` cannot be re-opened (the last two in
``supervision.py``). Each is a typed `Loss`: DEGRADED with its text as the reason, tools
withdrawn (callback with None), a reconnect after a capped, jittered backoff.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp_types
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolatlas.calls import UpstreamCall, UpstreamReply
from toolatlas.catalog.model import ToolRecord
from toolatlas.config import Upstream
from toolatlas.errors import UpstreamProtocolError, UpstreamUnavailable
from toolatlas.backoff import backoff_delay
from toolatlas.upstream.client import (
    AuthWatch, Loss, LossReason, Phase, begin_teardown, classify, make_client, phase_timeout,
)
from toolatlas.upstream.federation import capabilities, set_log_level
from toolatlas.upstream.inbound import Inbound
from toolatlas.upstream.listing import LISTING_GATE, converted, list_all_tools
from toolatlas.upstream.relay import relay_call
from toolatlas.upstream.requests import RESTARTED, call_tool, on_session
from toolatlas.upstream.state import Action, Event, UpstreamState, decide
from toolatlas.upstream.supervision import Supervision
from toolatlas.upstream.transports import StdioProcess, open_transport

logger = logging.getLogger(__name__)

ToolsCallback = Callable[[str, "list[ToolRecord] | None"], Awaitable[None]]
# observer(upstream, kind, fields): kind is "state" (old, new, reason), "reconnect",
# "list_changed" or "call" (operation, seconds, outcome). Synchronous, cheap, never raises.
Observer = Callable[[str, str, dict[str, Any]], None]

# A session READY this long resets the backoff attempt count when it is lost.
HEALTHY_RESET = 60.0
T = TypeVar("T")


class Connection:
    """One connection attempt, from spawn or connect to teardown; `run()` is awaited by
    the owner task, so transport and `Client` are entered and exited in that one task.

    Implements `supervision.Supervised` for the watchers it starts while READY.
    """

    def __init__(self, session: UpstreamSession) -> None:
        self._s = session
        self.name = session.name
        self.upstream = session.upstream
        self.lost = anyio.Event()
        self.loss: Loss | None = None
        self.client: Client | None = None  # set while READY
        self.reached_ready = False
        # Set by the HTTP transport on a 404 to a request carrying our (2025-era) session id.
        self._expired = False
        self.supervision = Supervision(self, in_flight=lambda: session.upstream.max_concurrency - session.sem.value)
        self.auth = AuthWatch(self.upstream)
        self.transport = open_transport(
            self.upstream, on_eof=lambda what: self.mark_lost(self._eof_loss(what)), on_expired=self._on_expired,
            on_response=self.auth.response,
        )
        self.proc = self.transport if isinstance(self.transport, StdioProcess) else None

    @property
    def tools(self) -> list[ToolRecord] | None:
        return self._s.tools

    async def publish(self, tools: list[ToolRecord] | None) -> None:
        await self._s.publish(tools)

    def observe_list_changed(self) -> None:
        self._s.observe("list_changed")

    async def lists_changed(self, kind: str) -> None:
        await self._s.inbound.changed(kind)

    def mark_lost(self, loss: Loss) -> None:
        """The session is gone (first loss wins); the owner task tears it down."""
        if not self.lost.is_set():
            self.loss = loss
            self.lost.set()

    def classify(self, exc: BaseException) -> LossReason:
        """`client.classify`, refined by what the transport saw: after a 404 on our session id
        every failure means the session expired; until it is lost or we close it, a -32000 is the upstream's."""
        live = not self.lost.is_set() and not self._s.stop_requested  # our own close: "Connection closed" is ours
        return LossReason.SESSION_EXPIRED if self._expired else classify(exc, live=live)

    def describe(self, exc: BaseException) -> str:  # an HTTP 401/403 said as an authentication failure
        return self.auth.describe(exc)

    def _on_expired(self) -> None:
        self._expired = True

    def _eof_loss(self, what: str) -> Loss:
        if what == "stdio" and self.proc is not None and self.proc.returncode is not None:
            return Loss(LossReason.EOF, self.proc.describe_exit())
        return Loss(LossReason.EOF, f"{what} connection closed")

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            logger.debug("upstream %s: transport error: %s", self.name, self.describe(message))
            return
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.supervision.tools_changed("tools/list_changed")
        else:
            await self._s.inbound.message(message)

    async def run(self) -> Loss:
        """Connect, serve until lost, tear down (shielded, bounded). Returns why it ended."""
        up = self.upstream
        client = make_client(self.transport, mode=self._s.mode, message_handler=self._on_message,
                             elicitation_callback=self._s.inbound.elicit)
        phase = Phase("connect", up.timeouts.connect)
        loss = _ENDED
        timed_out = False
        with anyio.CancelScope(deadline=anyio.current_time() + up.timeouts.connect) as deadline:
            try:
                # `async with`, not an exit stack: the transport may cancel its own task
                # group (whose scope encloses this body), and only an __aexit__ that sees
                # that CancelledError can absorb it.
                async with client:
                    try:
                        await self._serve(client, deadline, phase)
                    finally:
                        self.client = None
                        timed_out = begin_teardown(deadline)
                loss = self.loss or _ENDED
            except Exception as exc:  # noqa: BLE001 - every failure is a reason to retry
                if self.lost.is_set() or self.reached_ready:
                    loss = self.loss or Loss(self.classify(exc), f"session failed: {self.describe(exc)}")
                elif isinstance(exc, UpstreamProtocolError):
                    loss = Loss(LossReason.PROTOCOL, str(exc))
                else:
                    loss = Loss(self.classify(exc), f"{phase.name} failed: {self.describe(exc)}")
        timed_out = timed_out or deadline.cancelled_caught
        if timed_out and not self.reached_ready:  # a child stuck at its start often says why (a login URL, a download)
            loss = phase_timeout(self.name, phase, self.proc.last_words() if self.proc else None)
        if self.proc is not None and self.proc.returncode is not None and loss.reason is LossReason.EOF:
            # A dead child explains more than "connection closed" does.
            loss = Loss(LossReason.EOF, self.proc.describe_exit())
        return loss

    async def _serve(self, client: Client, deadline: anyio.CancelScope, phase: Phase) -> None:
        """Inside the entered client: subscribe, list, go READY, supervise until lost.

        ``phase``: the bounded step now running, for the timeout message. Returns once lost.
        """
        up, s = self.upstream, self._s
        s.protocol_version, s.capabilities = client.protocol_version, capabilities(client)
        modern = s.inbound.request_scoped_logs = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        async with anyio.create_task_group() as tg:
            if modern:
                # Subscribe before the first list, so a change in between is not missed.
                phase.name, phase.seconds = "subscriptions/listen", up.timeouts.ping
                deadline.deadline = anyio.current_time() + up.timeouts.ping + 1.0
                await tg.start(self.supervision.listen, client)
            deadline.deadline = math.inf  # waiting for a turn (listing.LISTING_GATE) is our own time
            async with LISTING_GATE.turn(up):
                phase.name, phase.seconds = "tools/list", up.timeouts.list_tools
                deadline.deadline = anyio.current_time() + up.timeouts.list_tools
                listed = await list_all_tools(client, up.name, phase.paged)
                if s.log_level is not None and "logging" in s.capabilities and not modern:
                    with contextlib.suppress(Exception):  # best effort: never a reason to fail the connection
                        await set_log_level(client, s.log_level)
                # Converting is our own work; a deadline that fired before ends the attempt as a timeout, never after READY.
                deadline.deadline = math.inf
                tools = await converted(up, listed)
                del listed  # the SDK's models, which this frame would keep for the session's life
            await anyio.sleep(0)
            self.client = client
            s.went_ready()
            self.reached_ready = True
            logger.info("upstream %s: %d tools, protocol %s%s", self.name, len(tools), s.protocol_version,
                        f", pid {self.proc.pid}" if self.proc is not None else "")
            await self.publish(tools)
            await self.supervision.run(client, tg, modern=modern)
            await self.lost.wait()
            tg.cancel_scope.cancel()
        loss = self.loss or _ENDED
        # Leave READY and withdraw before the (possibly slow) teardown: search must not
        # offer tools of a dead session while its child is being reaped.
        s.leave(True, loss)
        if self.tools is not None:
            await self.publish(None)
        # stdout EOF usually means the child died: a short wait gets its exit status.
        if self.proc is not None and loss.reason is LossReason.EOF and (ended := await self.proc.exit_reason(0.5)):
            self.loss = Loss(LossReason.EOF, ended)
            s.reason = ended


class UpstreamSession:
    """The supervisor of one upstream; `run()` is its owner task.

    Readable state for status: `state`, `reason`, `since`, `tools`, `reconnects`, `pid`,
    `protocol_version`, `next_retry_in()`, `last_error` (text, time: kept after a recovery).
    """

    def __init__(
        self,
        upstream: Upstream,
        on_tools: ToolsCallback,
        *,
        backoff: Callable[[int], float] | None = None,
        mode: str = "auto",
        observer: Observer | None = None,
        inbound: Inbound | None = None,
    ) -> None:
        self.upstream = upstream
        self.inbound = inbound or Inbound(upstream.name)
        self.capabilities: frozenset[str] = frozenset()  # of the last connection: see federation.capabilities
        self.log_level: str | None = None  # sent to a 2025-era upstream with logging at connect
        self._observer = observer
        self.name = upstream.name
        self.mode = mode
        self._on_tools = on_tools
        self._backoff = backoff or backoff_delay
        self.state = UpstreamState.CONNECTING if upstream.enabled else UpstreamState.DISABLED
        self.reason: str | None = None if upstream.enabled else "disabled in config"
        self.since = time.time()
        self.attempt = self.reconnects = 0
        self.last_error: tuple[str, float] | None = None
        self.tools: list[ToolRecord] | None = None  # what the callback last got
        self.protocol_version: str | None = None
        self._ready_at: float | None = None
        self._retry_at: float | None = None
        self._conn: Connection | None = None
        self.sem = anyio.Semaphore(upstream.max_concurrency, fast_acquire=True)  # a free slot: no yield
        self._settled = anyio.Event()
        self.attempt_ended = anyio.Event()  # replaced each time it is set (see _ended_attempt)
        self._done = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self.stop_requested: str | None = None  # who asked stop() (a reload, a restart, the daemon's stop)
        self._wake = anyio.Event()

    def __repr__(self) -> str:
        extra = f" reason={self.reason!r}" if self.reason else ""
        return f"<UpstreamSession {self.name} {self.upstream.__struct_config__.tag} state={self.state.value}{extra}>"

    # ---- status -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        proc = self._conn.proc if self._conn is not None else None
        if proc is None or proc.pid is None or proc.returncode is not None:
            return None
        return proc.pid

    def next_retry_in(self) -> float | None:
        if self._retry_at is None:
            return None
        return max(0.0, self._retry_at - anyio.current_time())

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    async def wait_settled(self) -> None:
        await self._settled.wait()

    async def wait_done(self) -> None:
        await self._done.wait()

    # ---- state machine glue ---------------------------------------------------------------

    def _apply(self, event: Event, *, reason: str | None = None) -> tuple[Action, ...]:
        healthy_for = (time.monotonic() - self._ready_at) if self._ready_at is not None else 0.0
        d = decide(self.state, event, attempt=self.attempt, healthy_for=healthy_for, reset_after=HEALTHY_RESET)
        old = self.state
        self.state, self.attempt = d.state, d.attempt
        self.reason = reason
        self.since = time.time()
        self._ready_at = time.monotonic() if d.state is UpstreamState.READY else None
        if d.state is not old:
            logger.info("upstream %s: %s -> %s%s", self.name, old.value, d.state.value, f" ({reason})" if reason else "")
            self.observe("state", old=old.value, new=d.state.value, reason=reason)
        return d.actions

    def observe(self, kind: str, **fields: Any) -> None:
        if self._observer is not None:
            try:
                self._observer(self.name, kind, fields)
            except Exception:  # an observer bug must never disturb the session
                logger.exception("upstream %s: observer failed on %s", self.name, kind)

    async def publish(self, tools: list[ToolRecord] | None) -> None:
        self.tools = tools
        try:
            await self._on_tools(self.name, tools)
        except Exception:
            # The pool must survive a faulty consumer; the next list retries the hand-over.
            logger.exception("upstream %s: the tools callback raised", self.name)

    def went_ready(self) -> None:
        """The connection listed its tools: READY, and the first attempt has settled."""
        self._apply(Event.CONNECTED)
        self._ended_attempt()

    def _ended_attempt(self) -> None:  # a connection went READY or ended: wake who waits for that
        self._settled.set()
        self.attempt_ended, ended = anyio.Event(), self.attempt_ended
        ended.set()

    def leave(self, was_ready: bool, loss: Loss) -> bool:
        """Feed LOST or CONNECT_FAILED once per connection; True if tools must be withdrawn."""
        self.last_error = (loss.text, time.time())
        if self.state is UpstreamState.DEGRADED:
            # Already applied (before teardown); keep the better reason if teardown found one.
            self.reason = loss.text
            return False
        actions = self._apply(Event.LOST if was_ready else Event.CONNECT_FAILED, reason=loss.text)
        return Action.WITHDRAW_TOOLS in actions

    # ---- the owner task ---------------------------------------------------------------

    async def run(self) -> None:
        """Owner task: runs until cancelled or `stop()`; leaves the upstream CLOSED."""
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self.stop_requested:
                    scope.cancel()
                if self.state is UpstreamState.DISABLED:
                    self._settled.set()
                    await anyio.sleep_forever()
                await self._loop()
            # Only stop() gets here (an outer cancellation propagates past): withdraw from
            # this task, as the contract promises.
            if self.tools is not None:
                with anyio.CancelScope(shield=True):
                    await self.publish(None)
        finally:
            if self._conn is not None:
                self._conn.client = None
            if self.state is not UpstreamState.CLOSED:
                self._apply(Event.CLOSE, reason="closed")
            self._retry_at = None
            self._ended_attempt()
            self._done.set()

    def stop(self, by: str = RESTARTED) -> None:
        """Ask the owner task to close the session and end (see `wait_done`); `by`: who asked."""
        self.stop_requested = by
        if self._scope is not None:
            self._scope.cancel()
        else:
            # Never ran (or not yet): run() will see the flag and exit before connecting.
            self._done.set()

    def retry_now(self) -> None:
        """Cut a pending backoff wait short (operator `refresh` on a DEGRADED upstream)."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            self.protocol_version = None
            conn = self._conn = Connection(self)
            loss = await conn.run()
            if self.leave(conn.reached_ready, loss) and self.tools is not None:
                await self.publish(None)
            self._ended_attempt()
            delay = max(0.0, float(self._backoff(self.attempt)))
            logger.warning("upstream %s: %s; reconnect attempt %d in %.2f s", self.name, loss.text, self.attempt,
                           delay)
            self._retry_at = anyio.current_time() + delay
            with anyio.move_on_after(delay):
                await self._wake.wait()
            self._wake = anyio.Event()
            self._retry_at = None
            self._apply(Event.RETRY, reason=f"reconnecting after: {loss.text}")
            self.reconnects += 1
            self.observe("reconnect")

    # ---- operator and calls, from other tasks -----------------------------------------

    async def refresh(self) -> None:
        """Re-list now and return once that re-list finished and the callback got the
        complete list (even when unchanged: an operator's refresh always hands it over).

        DEGRADED: cuts the backoff wait short and returns at once. Raises UpstreamUnavailable
        when the upstream is disabled, closed, or the session is lost meanwhile, and
        UpstreamTimeout when the re-list does not finish within timeouts.list_tools.
        """
        if self.state is UpstreamState.DEGRADED:
            self.retry_now()
            return
        conn = self._conn
        if self.state is not UpstreamState.READY or conn is None:
            raise UpstreamUnavailable(self._unavailable_message())
        ready = lambda: self.state is UpstreamState.READY  # noqa: E731
        if not await conn.supervision.relist_now(conn.lost, ready, self.upstream.timeouts.list_tools * 2):
            raise UpstreamUnavailable(self._unavailable_message())

    def _unavailable_message(self) -> str:
        conn = self._conn
        if self.stop_requested:  # READY while it tears down, then CLOSED: neither says what goes on
            return f"upstream {self.name!r} is closing its session ({self.stop_requested}); retry in a moment"
        if self.state is UpstreamState.READY:  # without a usable client: the session is ending
            why = conn.loss.text if conn is not None and conn.loss is not None else "it ended; retry in a moment"
            return f"upstream {self.name!r} lost its session: {why}"
        return f"upstream {self.name!r} is {self.state.value}" + (f": {self.reason}" if self.reason else "")

    def warm(self) -> tuple[Connection, Client]:
        """The READY connection and its client; UpstreamUnavailable saying why when there is none."""
        conn = self._conn
        client = conn.client if conn is not None else None
        if self.state is not UpstreamState.READY or conn is None or client is None or conn.lost.is_set():
            raise UpstreamUnavailable(self._unavailable_message())
        return conn, client

    async def request(self, op: str, fn: Callable[[Client], Awaitable[T]], seconds: float | None = None, *,
                      operation: str = "request") -> T:
        """`fn(client)` on the warm session; see `requests.on_session` for the contract."""
        return await on_session(self, op, fn, seconds if seconds is not None else self.upstream.timeouts.call, operation)

    async def call_tool(self, call: UpstreamCall) -> UpstreamReply:
        """`call` on the warm session (`Pool.call_tool` has the contract); raw on stdio: `relay_call`."""
        proc = self._conn.proc if self._conn is not None else None
        raw = call.raw and call.log is None and proc is not None
        return await self.request(f"tools/call {call.tool}", lambda client: relay_call(
            client, proc.relay, proc.send_line, call, self.inbound) if raw and proc is not None else call_tool(
            client, call, self.inbound), call.timeout, operation="call_tool")


_ENDED = Loss(LossReason.EOF, "session ended")  # the client context exited without a recorded loss
