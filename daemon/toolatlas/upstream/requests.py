"""Requests made on an upstream's warm session from other tasks than its owner: the bounds
and the error mapping every one of them gets, and the tools/call itself."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import mcp_types
from mcp import Client

from toolatlas.calls import InputRequired, ProgressFn, UpstreamCall, UpstreamReply
from toolatlas.errors import ToolatlasError, UpstreamTimeout, UpstreamUnavailable
from toolatlas.upstream.client import Loss, LossReason, call_error, progress_fn, session_forgotten
from toolatlas.upstream.federation import resource_uris
from toolatlas.upstream.inbound import CUT_ASKING, Inbound
from toolatlas.upstream.state import UpstreamState

if TYPE_CHECKING:
    from toolatlas.upstream.client import AuthWatch

T = TypeVar("T")
# Who stopped a session, as the calls it cut say ("closed by ..."), unless the stop names another.
RESTARTED = "a config reload or a restart"
# Seconds a call that lost its stdio child waits for the child's exit status, to say it.
EXIT_WAIT = 0.5


class _Session(Protocol):
    name: str
    sem: anyio.Semaphore
    stop_requested: str | None  # who stopped the session, as the calls it cut say ("closed by ...")

    def observe(self, kind: str, **fields: Any) -> None: ...


class _Warm(_Session, Protocol):
    attempt_ended: anyio.Event  # set when a connection attempt goes READY or ends
    reconnects: int
    state: UpstreamState

    def warm(self) -> tuple[Any, Client]: ...


class SessionForgotten(UpstreamUnavailable):
    """The upstream no longer knew the session (HTTP 404 on its id), so it did not run the request."""


class _Child(Protocol):
    async def exit_reason(self, wait: float) -> str | None: ...


class _Connection(Protocol):
    auth: AuthWatch

    @property
    def proc(self) -> _Child | None: ...  # a stdio child

    def classify(self, exc: BaseException) -> LossReason: ...

    def describe(self, exc: BaseException) -> str: ...

    def mark_lost(self, loss: Loss) -> None: ...


class CallClock:
    """A tool call's deadline, moved on by the upstream's progress. MCP lets a client "reset
    the timeout clock when receiving a progress notification" and asks it to "always enforce
    a maximum": a call ends `seconds` after its last sign of work (its start, then each
    progress notification), and never later than `most` seconds after its start. Pool.call_tool
    makes one per call (`CALL_CLOCK`, read by `bounded` in the same task) and has every call
    ask the upstream for progress, so a long build or crawl that reports it is not cut."""

    def __init__(self, seconds: float, most: float) -> None:
        self.seconds, self.most = seconds, max(seconds, most)
        self._scope: anyio.CancelScope | None = None
        self._end = math.inf
        self.moved = False

    def attach(self, scope: anyio.CancelScope) -> None:
        """The scope `bounded` runs the call in (again on a retry: the same end)."""
        self._scope = scope
        if self._end == math.inf:
            self._end = anyio.current_time() + self.most

    def progressed(self) -> None:
        scope = self._scope
        if scope is not None:
            later = min(anyio.current_time() + self.seconds, self._end)
            if later > scope.deadline:
                scope.deadline, self.moved = later, True

    def progress(self, forward: ProgressFn | None) -> ProgressFn:
        """A progress callback that moves the deadline on, then calls `forward` (if any)."""
        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            self.progressed()
            if forward is not None:
                await forward(value, total, message)
        return on_progress


CALL_CLOCK: ContextVar[CallClock | None] = ContextVar("toolatlas_call_clock", default=None)


async def bounded(session: _Session, conn: _Connection, client: Client, op: str,
                  fn: Callable[[Client], Awaitable[T]], seconds: float, operation: str) -> T:
    """`fn(client)` under the session's max_concurrency, within `seconds` (the wait for a
    slot included). `op` names the request in errors, `operation` in metrics.

    Raises UpstreamTimeout(upstream, op, seconds); UpstreamUnavailable when the session is
    gone (closed under it by a reload or a restart: said so) or the upstream refused who we are; UpstreamProtocolError for a JSON-RPC error or
    an invalid result. A toolatlas error raised by `fn` passes unchanged. A timed-out or
    cancelled request leaves the session usable."""
    t0 = time.perf_counter()
    CUT_ASKING.set(False)
    try:
        # anyio.fail_after's rule without its two generator context managers (per call).
        with anyio.CancelScope(deadline=anyio.current_time() + seconds) as scope:
            if (clock := CALL_CLOCK.get()) is not None:
                clock.attach(scope)
            async with session.sem:
                result = await fn(client)
        if scope.cancelled_caught and anyio.current_time() >= scope.deadline:
            raise TimeoutError
        # Metrics after the reply (the loop's next callback): off the caller's path, as CallService's.
        asyncio.get_running_loop().call_soon(partial(session.observe, "call", operation=operation,
                                                     seconds=time.perf_counter() - t0, outcome="ok"))
        return result
    except TimeoutError:
        session.observe("call", operation=operation, seconds=time.perf_counter() - t0, outcome="timeout")
        clock = CALL_CLOCK.get()
        if clock is not None and clock.moved:  # progress moved it on: the whole time, not the first span
            raise UpstreamTimeout(session.name, op, round(time.perf_counter() - t0, 1), asking=CUT_ASKING.get()) from None
        raise UpstreamTimeout(session.name, op, seconds, asking=CUT_ASKING.get()) from None
    except ToolatlasError:
        raise
    except Exception as exc:
        reason = conn.classify(exc)
        if reason.session_gone:
            conn.mark_lost(Loss(reason, f"{op} failed: {conn.describe(exc)}"))
        if refused := conn.auth.failure(exc):
            raise UpstreamUnavailable(f"upstream {session.name!r} refused {op}: {refused}") from exc
        if session_forgotten(exc):
            raise SessionForgotten(f"upstream {session.name!r} lost its session during {op}: {conn.describe(exc)}") from exc
        if session.stop_requested:  # our own close, not the upstream's failure
            raise UpstreamUnavailable(f"upstream {session.name!r} was closed by {session.stop_requested} "
                                      f"during {op}; it may have run: retry if that is safe") from exc
        if reason is LossReason.EOF and conn.proc is not None and (ended := await conn.proc.exit_reason(EXIT_WAIT)):
            # "Connection closed" (the SDK's, or the relay's copy of it) does not say the child died, nor how
            raise UpstreamUnavailable(f"upstream {session.name!r} lost its session during {op}: {ended}") from exc
        raise call_error(session.name, op, exc, reason) from exc


async def on_session(session: _Warm, op: str, fn: Callable[[Client], Awaitable[T]], seconds: float,
                     operation: str) -> T:
    """`bounded` on the session's warm connection (UpstreamUnavailable when it has none). A
    request the upstream refused because it no longer knew the session (it restarted, or
    expired the session) did not run: it is made once more on the next session when that
    one is READY within the same `seconds`; else it fails as it did."""
    deadline = anyio.current_time() + seconds
    conn, client = session.warm()
    try:
        return await bounded(session, conn, client, op, fn, seconds, operation)
    except SessionForgotten as exc:
        forgotten, lost_at = exc, session.reconnects
    with anyio.move_on_after(deadline - anyio.current_time()):
        while not session.stop_requested:
            ended = session.attempt_ended
            try:
                fresh = session.warm()
            except UpstreamUnavailable:
                if session.reconnects > lost_at and session.state is UpstreamState.DEGRADED:
                    break  # the next session could not be opened
            else:
                if fresh[0] is not conn:
                    return await bounded(session, *fresh, op, fn, deadline - anyio.current_time(), operation)
            await ended.wait()
    raise forgotten


async def call_tool(client: Client, call: UpstreamCall, inbound: Inbound) -> UpstreamReply:
    """`call` on `client`; the upstream's questions during it go to `call.elicit`. With
    `allow_input_required` a 2026-07-28 upstream's input_required is returned as is."""
    tool, arguments, progress = call.tool, call.arguments, progress_fn(call.progress)
    # A 2026-07-28 upstream sends log messages only for a request that opts in.
    meta: mcp_types.RequestParamsMeta | None = None
    if call.log is not None and call.log_level:
        meta = mcp_types.RequestParamsMeta()
        meta[mcp_types.LOG_LEVEL_META_KEY] = call.log_level  # type: ignore[literal-required]
    result: mcp_types.CallToolResult | mcp_types.InputRequiredResult
    with inbound.call(tool, call.elicit, call.log, call.log_scoped_only):
        if call.allow_input_required:
            result = await client.session.call_tool(
                tool, arguments, progress_callback=progress,
                input_responses=dict(call.input_responses) if call.input_responses else None,
                request_state=call.request_state, allow_input_required=True, meta=meta,
            )
        else:
            result = await client.call_tool(tool, arguments, progress_callback=progress, meta=meta)
    if isinstance(result, mcp_types.InputRequiredResult):
        return UpstreamReply(input_required=InputRequired(result.input_requests, result.request_state))
    return UpstreamReply(payload=result, is_error=bool(result.is_error), resource_uris=resource_uris(result))


__all__ = ["CALL_CLOCK", "CallClock", "SessionForgotten", "bounded", "call_tool", "on_session"]
