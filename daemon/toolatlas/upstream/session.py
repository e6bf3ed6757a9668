"""One upstream's owner task: connect, list, supervise, reconnect.

The owner task is the only task that enters and exits the transport and the SDK `Client`
(the SDK requires enter and exit in one task); other tasks call tools through the entered
client, which the SDK allows concurrently. Every await on the upstream has a named timeout
from `Upstream.timeouts`; a timeout becomes `UpstreamTimeout(upstream, operation, seconds)`.

Supervision notices a dead session four ways: the transport's read stream ends (stdio child
exit, SSE stream drop), a call fails with a connection-level error (HTTP 404 on a stale
session id, refused connection), a health check fails (legacy: ping every `ping_interval`;
2026-07-28 has no ping, so a `server/discover` stands in), or the `subscriptions/listen`
stream cannot be re-opened. Each leads to DEGRADED with a reason, the tools are withdrawn
(callback with None), and a reconnect follows after a capped, jittered backoff.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from toolatlas.calls import InputRequired, UpstreamCall, UpstreamReply
from toolatlas.catalog.model import ToolRecord
from toolatlas.config import Upstream
from toolatlas.errors import UpstreamProtocolError, UpstreamTimeout, UpstreamUnavailable
from toolatlas.upstream.backoff import backoff_delay
from toolatlas.upstream.listing import list_records
from toolatlas.upstream.state import Action, Event, UpstreamState, decide
from toolatlas.upstream.transports import StdioProcess, open_transport

logger = logging.getLogger(__name__)

ToolsCallback = Callable[[str, "list[ToolRecord] | None"], Awaitable[None]]
ProgressCallback = Callable[[float, "float | None", "str | None"], Awaitable[None]]
# observer(upstream, kind, fields): kind is "state" (old, new, reason), "reconnect",
# "list_changed" or "call" (operation, seconds, outcome). Synchronous, cheap, never raises.
Observer = Callable[[str, str, dict[str, Any]], None]

# Bounds on one complete tools/list walk: a paginator that never ends cannot hang us.
# Seconds a teardown may take (stdio escalation is bounded below this on its own).
CLOSE_TIMEOUT = 10.0
# A session READY this long resets the backoff attempt count when it is lost.
HEALTHY_RESET = 60.0
# Consecutive failed re-listens of subscriptions/listen before the session counts as lost.
LISTEN_MAX_FAILURES = 3

_CLIENT_INFO = mcp_types.Implementation(name="toolatlas", version="0.1.0")


def describe(exc: BaseException) -> str:
    """A one-line reason for logs and status: the innermost meaningful error."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"JSON-RPC error {exc.error.code}: {exc.error.message}"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from {exc.request.url}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def _is_connection_error(exc: BaseException) -> bool:
    """True when the session itself is gone (reconnect), not just this request."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        if exc.error.code == mcp_types.CONNECTION_CLOSED:
            return True
        # A 404 on a stale (2025-era) streamable HTTP session id: the SDK says "Session
        # terminated", the Python server's body says "Session not found".
        return exc.error.code == mcp_types.INVALID_REQUEST and exc.error.message in (
            "Session terminated", "Session not found",
        )
    return isinstance(
        exc, (httpx2.TransportError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, EOFError)
    )


async def _no_direct_elicitation(ctx: Any, params: Any) -> mcp_types.ErrorData:
    """Elicitation is passed through to 2026-07-28 callers as input_required; a caller on an
    older protocol cannot answer one, and the gateway will not answer on anyone's behalf."""
    return mcp_types.ErrorData(
        code=mcp_types.INVALID_REQUEST,
        message="this tool asks the user for input; call it through toolatlas with MCP 2026-07-28 "
                "(input_required) to answer",
    )


def make_client(up: Upstream, transport: Any, *, mode: str, message_handler: Any = None) -> Client:
    # The elicitation callback declares the capability (upstreams check it before asking);
    # the questions themselves travel to the gateway's caller as input_required.
    return Client(
        transport,
        mode=mode,
        message_handler=message_handler,
        client_info=_CLIENT_INFO,
        elicitation_callback=_no_direct_elicitation,
    )


class UpstreamSession:
    """The supervisor of one upstream; `run()` is its owner task.

    Readable state for status: `state`, `reason`, `since`, `tools`, `reconnects`, `pid`,
    `protocol_version`, `next_retry_in()`.
    """

    def __init__(
        self,
        upstream: Upstream,
        on_tools: ToolsCallback,
        *,
        backoff: Callable[[int], float] | None = None,
        mode: str = "auto",
        observer: Observer | None = None,
    ) -> None:
        self.upstream = upstream
        self._observer = observer
        self.name = upstream.name
        self.mode = mode
        self._on_tools = on_tools
        self._backoff = backoff or backoff_delay
        self.state = UpstreamState.CONNECTING if upstream.enabled else UpstreamState.DISABLED
        self.reason: str | None = None if upstream.enabled else "disabled in config"
        self.since = time.time()
        self.attempt = 0
        self.reconnects = 0
        self.tools: list[ToolRecord] | None = None  # what the callback last got
        self.protocol_version: str | None = None
        self._ready_at: float | None = None
        self._retry_at: float | None = None
        self._client: Client | None = None
        self._proc: StdioProcess | None = None
        self._sem = anyio.Semaphore(upstream.max_concurrency)
        self._settled = anyio.Event()
        self._done = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._stop_requested = False
        self._wake = anyio.Event()
        self._lost = anyio.Event()
        self._lost_reason: str | None = None
        self._relist_wanted = anyio.Event()
        self._relist_started = 0
        self._relist_done = 0
        self._relist_evt = anyio.Event()
        self._force_publish = False
        self._reached_ready = False

    def __repr__(self) -> str:
        extra = f" reason={self.reason!r}" if self.reason else ""
        return f"<UpstreamSession {self.name} {self.upstream.__struct_config__.tag} state={self.state.value}{extra}>"

    # ---- status -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        proc = self._proc
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
            if reason:
                logger.info("upstream %s: %s -> %s (%s)", self.name, old.value, d.state.value, reason)
            else:
                logger.info("upstream %s: %s -> %s", self.name, old.value, d.state.value)
            self._observe("state", old=old.value, new=d.state.value, reason=reason)
        return d.actions

    def _observe(self, kind: str, **fields: Any) -> None:
        if self._observer is not None:
            try:
                self._observer(self.name, kind, fields)
            except Exception:  # an observer bug must never disturb the session
                logger.exception("upstream %s: observer failed on %s", self.name, kind)

    async def _publish(self, tools: list[ToolRecord] | None) -> None:
        self.tools = tools
        try:
            await self._on_tools(self.name, tools)
        except Exception:
            # The pool must survive a faulty consumer; the next list retries the hand-over.
            logger.exception("upstream %s: the tools callback raised", self.name)

    def _mark_lost(self, reason: str) -> None:
        if not self._lost.is_set():
            self._lost_reason = reason
            self._lost.set()

    # ---- the owner task ---------------------------------------------------------------

    async def run(self) -> None:
        """Owner task: runs until cancelled or `stop()`; leaves the upstream CLOSED."""
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._stop_requested:
                    scope.cancel()
                if self.state is UpstreamState.DISABLED:
                    self._settled.set()
                    await anyio.sleep_forever()
                await self._loop()
            # Only stop() gets here (an outer cancellation propagates past): withdraw from
            # this task, as the contract promises.
            if self.tools is not None:
                with anyio.CancelScope(shield=True):
                    await self._publish(None)
        finally:
            self._client = None
            if self.state is not UpstreamState.CLOSED:
                self._apply(Event.CLOSE, reason="closed")
            self._retry_at = None
            self._settled.set()
            self._done.set()

    def stop(self) -> None:
        """Ask the owner task to close the session and end (see `wait_done`)."""
        self._stop_requested = True
        if self._scope is not None:
            self._scope.cancel()
        else:
            # Never ran (or not yet): run() will see the flag and exit before connecting.
            self._done.set()

    def retry_now(self) -> None:
        """Cut a pending backoff wait short (operator `refresh` on a DEGRADED upstream)."""
        self._wake.set()

    def _leave(self, was_ready: bool, reason: str) -> bool:
        """Feed LOST or CONNECT_FAILED once per connection; True if tools must be withdrawn."""
        if self.state is UpstreamState.DEGRADED:
            # Already applied (before teardown); keep the better reason if teardown found one.
            self.reason = reason
            return False
        actions = self._apply(Event.LOST if was_ready else Event.CONNECT_FAILED, reason=reason)
        return Action.WITHDRAW_TOOLS in actions

    async def _loop(self) -> None:
        while True:
            was_ready, reason = await self._session_once()
            if self._leave(was_ready, reason) and self.tools is not None:
                await self._publish(None)
            self._settled.set()
            delay = max(0.0, float(self._backoff(self.attempt)))
            logger.warning(
                "upstream %s: %s; reconnect attempt %d in %.2f s", self.name, reason, self.attempt, delay
            )
            self._retry_at = anyio.current_time() + delay
            with anyio.move_on_after(delay):
                await self._wake.wait()
            self._wake = anyio.Event()
            self._retry_at = None
            self._apply(Event.RETRY, reason=f"reconnecting after: {reason}")
            self.reconnects += 1
            self._observe("reconnect")

    async def _session_once(self) -> tuple[bool, str]:
        """One connection's whole life. Returns (was it READY, why it ended)."""
        up = self.upstream
        self._lost = anyio.Event()
        self._lost_reason = None
        self._reached_ready = False
        self.protocol_version = None
        transport = open_transport(up, on_eof=lambda what: self._mark_lost(self._eof_reason(what)))
        self._proc = transport if isinstance(transport, StdioProcess) else None
        client = make_client(up, transport, mode=self.mode, message_handler=self._on_message)
        phase = "connect"
        stage_seconds = up.timeouts.connect
        reason = "session ended"
        timed_out = False
        with anyio.CancelScope(deadline=anyio.current_time() + up.timeouts.connect) as deadline:
            try:
                # `async with`, not an exit stack: the transport may cancel its own task
                # group (whose scope encloses this body), and only an __aexit__ that sees
                # that CancelledError can absorb it.
                async with client:
                    try:
                        await self._serve(client, transport, deadline, phase_box := [phase, stage_seconds])
                    finally:
                        phase, stage_seconds = phase_box
                        self._client = None
                        # Teardown is shielded from outer cancellation and bounded.
                        timed_out = deadline.cancel_called
                        deadline.shield = True
                        if not timed_out:
                            deadline.deadline = anyio.current_time() + CLOSE_TIMEOUT
                reason = self._lost_reason or "session ended"
            except Exception as exc:  # noqa: BLE001 - every failure is a reason to retry
                if self._lost.is_set() or self._reached_ready:
                    reason = self._lost_reason or f"session failed: {describe(exc)}"
                elif isinstance(exc, UpstreamProtocolError):
                    reason = str(exc)
                else:
                    reason = f"{phase} failed: {describe(exc)}"
        ready = self._reached_ready
        timed_out = timed_out or deadline.cancelled_caught
        if timed_out and not ready:
            reason = str(UpstreamTimeout(self.name, phase, stage_seconds))
        if isinstance(transport, StdioProcess) and transport.returncode is not None and "onnection closed" in reason:
            # A dead child explains more than "connection closed" does.
            reason = transport.describe_exit()
        return ready, reason

    async def _serve(self, client: Client, transport: Any, deadline: anyio.CancelScope, phase: list[Any]) -> None:
        """Inside the entered client: subscribe, list, go READY, supervise until lost.

        ``phase`` ([name, seconds]) tracks which bounded step is running, for the timeout
        message. Returns when the session was lost.
        """
        up = self.upstream
        self.protocol_version = client.protocol_version
        modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        async with anyio.create_task_group() as tg:
            if modern:
                # Subscribe before the first list, so a change in between is not missed.
                phase[:] = ["subscriptions/listen", up.timeouts.ping]
                deadline.deadline = anyio.current_time() + up.timeouts.ping + 1.0
                await tg.start(self._listen_loop, client)
            phase[:] = ["tools/list", up.timeouts.list_tools]
            deadline.deadline = anyio.current_time() + up.timeouts.list_tools
            tools = await list_records(client, self.name)
            deadline.deadline = math.inf
            self._client = client
            self._apply(Event.CONNECTED)
            self._reached_ready = True
            logger.info(
                "upstream %s: %d tools, protocol %s%s",
                self.name, len(tools), self.protocol_version,
                f", pid {self._proc.pid}" if self._proc is not None else "",
            )
            self._settled.set()
            await self._publish(tools)
            await self._supervise(client, tg, modern)
        reason = self._lost_reason or "session ended"
        # Leave READY and withdraw before the (possibly slow) teardown: search must not
        # offer tools of a dead session while its child is being reaped.
        self._leave(True, reason)
        if self.tools is not None:
            await self._publish(None)
        if isinstance(transport, StdioProcess) and "onnection closed" in reason:
            # stdout EOF usually means the child died: a short wait gets its exit status.
            with anyio.move_on_after(0.5):
                while transport.returncode is None:
                    await anyio.sleep(0.01)
            if transport.returncode is not None:
                self._lost_reason = self.reason = transport.describe_exit()

    def _eof_reason(self, what: str) -> str:
        if what == "stdio" and self._proc is not None and self._proc.returncode is not None:
            return self._proc.describe_exit()
        return f"{what} connection closed"

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            logger.debug("upstream %s: transport error: %s", self.name, describe(message))
            return
        inner = getattr(message, "root", message)
        if isinstance(inner, mcp_types.ToolListChangedNotification):
            logger.info("upstream %s: tools/list_changed", self.name)
            self._observe("list_changed")
            self._relist_wanted.set()

    # ---- supervision ------------------------------------------------------------------

    async def _supervise(self, client: Client, tg: anyio.abc.TaskGroup, modern: bool) -> None:
        up = self.upstream
        tg.start_soon(self._relist_worker, client)
        if up.relist_interval > 0:
            tg.start_soon(self._relist_timer, up.relist_interval)
        if up.ping_interval > 0:
            tg.start_soon(self._health_loop, client, modern)
        await self._lost.wait()
        tg.cancel_scope.cancel()

    async def _relist_timer(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            self._relist_wanted.set()

    async def _health_loop(self, client: Client, modern: bool) -> None:
        up = self.upstream
        op = "server/discover (health check)" if modern else "ping"
        while True:
            await anyio.sleep(up.ping_interval)
            try:
                with anyio.fail_after(up.timeouts.ping):
                    if modern:
                        # 2026-07-28 has no ping; server/discover is small and every server
                        # implements it (a tools/list here parsed a whole page of tools on
                        # the event loop each interval, per upstream).
                        await client.session.send_discover(client.protocol_version)
                    else:
                        await client.session.send_ping()
            except TimeoutError:
                self._mark_lost(f"health check failed: {UpstreamTimeout(self.name, op, up.timeouts.ping)}")
                return
            except Exception as exc:  # noqa: BLE001
                self._mark_lost(f"health check failed: {op}: {describe(exc)}")
                return

    async def _listen_loop(
        self, client: Client, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """2026-07-28: keep a `subscriptions/listen` stream open; every event means re-list.

        Signals started once the first stream is acknowledged (or listening proved
        impossible), so the caller can list tools knowing no change slips in between.
        """
        up = self.upstream
        failures = 0
        first = True
        started = False
        while True:
            try:
                with anyio.CancelScope(deadline=anyio.current_time() + up.timeouts.ping) as ack:
                    async with client.listen(tools_list_changed=True) as sub:
                        ack.deadline = math.inf
                        failures = 0
                        if not started:
                            started = True
                            task_status.started()
                        if not first:
                            # No replay after a drop: whatever changed meanwhile needs a refetch.
                            self._relist_wanted.set()
                        first = False
                        async for _event in sub:
                            logger.info("upstream %s: tools list changed (listen)", self.name)
                            self._observe("list_changed")
                            self._relist_wanted.set()
                if ack.cancelled_caught:
                    raise TimeoutError(f"no subscriptions/listen acknowledgment within {up.timeouts.ping:g} s")
                logger.debug("upstream %s: listen stream closed by the server; re-listening", self.name)
            except ListenNotSupportedError:
                if not started:
                    task_status.started()
                return
            except MCPError as exc:
                if exc.error.code == mcp_types.METHOD_NOT_FOUND:
                    logger.info("upstream %s: no subscriptions/listen; relying on polling", self.name)
                    if not started:
                        task_status.started()
                    return
                failures += 1
                last = describe(exc)
            except (SubscriptionLost, TimeoutError, Exception) as exc:  # noqa: BLE001
                failures += 1
                last = describe(exc)
            else:
                failures += 1
                last = "listen stream closed"
            if failures >= LISTEN_MAX_FAILURES:
                if not started:
                    raise UpstreamProtocolError(
                        f"upstream {self.name!r}: subscriptions/listen failed {failures} times: {last}"
                    )
                self._mark_lost(f"subscriptions/listen lost {failures} times: {last}")
                return
            await anyio.sleep(min(0.05 * 2**failures, 2.0))

    async def _relist_worker(self, client: Client) -> None:
        up = self.upstream
        while True:
            await self._relist_wanted.wait()
            self._relist_wanted = anyio.Event()
            self._relist_started += 1
            seq = self._relist_started
            try:
                with anyio.fail_after(up.timeouts.list_tools):
                    tools = await list_records(client, self.name)
            except TimeoutError:
                self._mark_lost(str(UpstreamTimeout(self.name, "tools/list", up.timeouts.list_tools)))
                return
            except Exception as exc:  # noqa: BLE001
                if _is_connection_error(exc):
                    self._mark_lost(f"tools/list failed: {describe(exc)}")
                    return
                # A server bug in listing keeps the last good catalog.
                logger.warning("upstream %s: re-list failed, keeping %d tools: %s",
                               self.name, len(self.tools or ()), describe(exc))
            else:
                forced, self._force_publish = self._force_publish, False
                if self.tools is None or forced or tools != self.tools:
                    if not forced:
                        logger.info("upstream %s: tool list changed: %d tools", self.name, len(tools))
                    await self._publish(tools)
            self._relist_done = seq
            evt, self._relist_evt = self._relist_evt, anyio.Event()
            evt.set()

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
        if self.state is not UpstreamState.READY:
            raise UpstreamUnavailable(self._unavailable_message())
        target = self._relist_started + 1
        lost = self._lost
        self._force_publish = True
        self._relist_wanted.set()
        seconds = self.upstream.timeouts.list_tools * 2
        with anyio.move_on_after(seconds) as scope:
            while self._relist_done < target:
                evt = self._relist_evt
                if lost.is_set() or self.state is not UpstreamState.READY:
                    raise UpstreamUnavailable(self._unavailable_message())
                async with anyio.create_task_group() as tg:
                    async def watch_lost() -> None:
                        await lost.wait()
                        tg.cancel_scope.cancel()
                    tg.start_soon(watch_lost)
                    await evt.wait()
                    tg.cancel_scope.cancel()
        if scope.cancelled_caught:
            raise UpstreamTimeout(self.name, "tools/list (refresh)", seconds)

    def _unavailable_message(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        if self.state is UpstreamState.READY and self._lost.is_set():
            return f"upstream {self.name!r} lost its session: {self._lost_reason}"
        return f"upstream {self.name!r} is {self.state.value}{why}"

    # ---- calls from other tasks -------------------------------------------------------

    async def call_tool(self, call: UpstreamCall) -> UpstreamReply:
        """Make `call` on the warm session; see `Pool.call_tool` for the error contract."""
        client = self._client
        if self.state is not UpstreamState.READY or client is None or self._lost.is_set():
            raise UpstreamUnavailable(self._unavailable_message())
        seconds = call.timeout if call.timeout is not None else self.upstream.timeouts.call
        tool, arguments, progress_callback = call.tool, call.arguments, call.progress
        op = f"tools/call {tool}"
        t0 = time.perf_counter()
        try:
            with anyio.fail_after(seconds):
                async with self._sem:
                    result: mcp_types.CallToolResult | mcp_types.InputRequiredResult
                    if call.allow_input_required:
                        result = await client.session.call_tool(
                            tool, arguments, progress_callback=progress_callback,
                            input_responses=dict(call.input_responses) if call.input_responses else None,
                            request_state=call.request_state, allow_input_required=True,
                        )
                    else:
                        result = await client.call_tool(tool, arguments, progress_callback=progress_callback)
            self._observe("call", operation="call_tool", seconds=time.perf_counter() - t0, outcome="ok")
            if isinstance(result, mcp_types.InputRequiredResult):
                return UpstreamReply(input_required=InputRequired(result.input_requests, result.request_state))
            return UpstreamReply(payload=result, is_error=bool(result.is_error))
        except TimeoutError:
            self._observe("call", operation="call_tool", seconds=time.perf_counter() - t0, outcome="timeout")
            raise UpstreamTimeout(self.name, op, seconds) from None
        except Exception as exc:
            if _is_connection_error(exc):
                self._mark_lost(f"{op} failed: {describe(exc)}")
                raise UpstreamUnavailable(
                    f"upstream {self.name!r} lost its session during {op}: {describe(exc)}"
                ) from exc
            if isinstance(exc, MCPError):
                raise UpstreamProtocolError(
                    f"upstream {self.name!r} answered {op} with JSON-RPC error {exc.error.code}: {exc.error.message}"
                ) from exc
            if isinstance(exc, ValidationError):
                raise UpstreamProtocolError(
                    f"upstream {self.name!r} sent an invalid result for {op}: {describe(exc)}"
                ) from exc
            raise UpstreamProtocolError(f"upstream {self.name!r} failed {op}: {describe(exc)}") from exc
