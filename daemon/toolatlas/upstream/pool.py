"""The upstream pool: one supervised owner task per configured upstream.

    pool = Pool(cfg.upstream, on_tools)
    await tg.start(pool.run)          # owner tasks spawned; connections proceed in background
    await pool.wait_settled(10)       # readiness: every upstream READY or DEGRADED
    await pool.call_tool(UpstreamCall(server="notes", tool="add_note", arguments={...}))

One bad upstream never disturbs the others: each owner task catches its own failures and
reconnects on its own schedule.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from toolatlas.calls import UpstreamCall, UpstreamReply
from toolatlas.catalog.model import ToolRecord
from toolatlas.config import Upstream
from toolatlas.errors import RelayRefused, UpstreamProtocolError, UpstreamTimeout, UpstreamUnavailable
from toolatlas.upstream import federation
from toolatlas.upstream.client import CLOSE_TIMEOUT, AuthWatch, LossReason, begin_teardown, classify, describe, make_client
from toolatlas.upstream.listing import list_records
from toolatlas.upstream.requests import CALL_CLOCK, RESTARTED, CallClock
from toolatlas.upstream.inbound import Inbound, ListsCallback, LogCallback
from toolatlas.upstream.session import Observer, ToolsCallback, UpstreamSession
from toolatlas.upstream.state import UpstreamState
from toolatlas.upstream.transports import StdioProcess, open_transport

logger = logging.getLogger(__name__)
# A reconcile's `why` as the calls it cuts say it (session.RESTARTED for the others).
STOPPED_BY = {"daemon stop": "the daemon stopping"}


@dataclass(frozen=True)
class UpstreamStatus:
    name: str
    transport: str  # "stdio" | "sse" | "http"
    state: UpstreamState
    tools: int  # tools currently offered to search (0 unless READY)
    reason: str | None  # why it is not READY (or the last reconnect cause)
    since: float  # time.time() of the last state change
    reconnects: int  # reconnect attempts since the pool started it
    next_retry_in: float | None  # seconds until the next attempt while DEGRADED
    pid: int | None  # stdio child's pid while it runs
    protocol_version: str | None  # negotiated MCP version while connected
    last_error: str | None = None  # why it last failed or was lost, kept once it is READY again
    last_error_at: float | None = None  # time.time() of that failure
    offers: frozenset[str] = frozenset()  # "resources", "prompts", "logging" while READY
    handshake: bool = False  # READY on a 2025-era protocol (its questions come as requests mid-call)


class Pool:
    """All upstreams; see the module docstring. Safe to construct outside an event loop."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        on_tools: ToolsCallback,
        *,
        backoff: Callable[[int], float] | None = None,
        mode: str = "auto",
        observer: Observer | None = None,
        on_lists: ListsCallback | None = None,
        on_log: LogCallback | None = None,
    ) -> None:
        """``mode`` is the SDK connect mode for every upstream ("auto", "legacy" or a
        2026-era version string); tests use it to force a protocol generation.
        ``observer(upstream, kind, fields)`` hears state changes, reconnects, list_changed
        and call latencies (metrics and events); it must be cheap and must not raise.
        ``on_lists(upstream, kind)`` hears that its "resources" or "prompts" changed,
        ``on_log(upstream, params)`` its log messages (`notifications/message` params)."""
        self._on_lists, self._on_log = on_lists, on_log
        self.log_level: str | None = None
        self._on_tools = on_tools
        self._observer = observer
        self._backoff = backoff
        self._mode = mode
        self._sessions: dict[str, UpstreamSession] = {}
        self._order: list[str] = []
        for up in upstreams:
            self._add(up)
        self._tg: anyio.abc.TaskGroup | None = None
        self._reconcile_lock = anyio.Lock()

    def __repr__(self) -> str:
        states = ", ".join(f"{s.name}={s.state.value}" for s in self._sessions.values())
        return f"<Pool {states}>"

    def _add(self, up: Upstream) -> UpstreamSession:
        s = UpstreamSession(up, self._on_tools, backoff=self._backoff, mode=self._mode, observer=self._observer,
                           inbound=Inbound(up.name, self._on_lists, self._on_log))
        s.log_level = self.log_level
        self._sessions[up.name] = s
        if up.name not in self._order:
            self._order.append(up.name)
        return s

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Spawn one owner task per upstream, signal started, run until cancelled.

        On cancellation every session closes (shielded, bounded; stdio children get stdin
        closed, SIGTERM, SIGKILL), so no child process outlives the pool.
        """
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for s in list(self._sessions.values()):
                    tg.start_soon(s.run, name=f"upstream:{s.name}")
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None

    async def wait_settled(self, timeout: float) -> None:
        """Return once every enabled upstream finished its first connection attempt
        (READY or DEGRADED), or after ``timeout`` seconds, whichever comes first."""
        with anyio.move_on_after(timeout):
            for s in list(self._sessions.values()):
                await s.wait_settled()

    def status(self) -> list[UpstreamStatus]:
        return [self._status(self._sessions[n]) for n in self._order if n in self._sessions]

    def get(self, name: str) -> UpstreamStatus | None:
        s = self._sessions.get(name)
        return None if s is None else self._status(s)

    def tools(self, name: str) -> list[ToolRecord] | None:
        """What `name` last handed to the tools callback (None: withdrawn or never listed)."""
        return self._session(name).tools

    @staticmethod
    def _status(s: UpstreamSession) -> UpstreamStatus:
        ready = s.state is UpstreamState.READY
        last, at = s.last_error or (None, None)
        return UpstreamStatus(
            name=s.name,
            transport=s.upstream.__struct_config__.tag,  # type: ignore[arg-type]
            state=s.state,
            tools=len(s.tools or ()) if ready else 0,
            reason=s.reason,
            since=s.since,
            reconnects=s.reconnects,
            next_retry_in=s.next_retry_in(),
            pid=s.pid,
            protocol_version=s.protocol_version if ready else None,
            last_error=last,
            last_error_at=at,
            offers=s.capabilities if ready else frozenset(),
            handshake=ready and s.protocol_version is not None and s.protocol_version not in federation.MODERN,
        )

    def _session(self, name: str) -> UpstreamSession:
        s = self._sessions.get(name)
        if s is None:
            raise UpstreamUnavailable(f"no upstream named {name!r} is configured")
        return s

    async def call_tool(self, call: UpstreamCall) -> UpstreamReply:
        """Make `call` on its upstream's warm session.

        With ``call.allow_input_required`` an upstream's `input_required` (2026-07-28
        elicitation/sampling) is returned as is, for the caller to pass on; the retry
        carries the input responses and the upstream's request state.

        ``call.timeout`` defaults to the upstream's ``timeouts.call`` and includes waiting for a
        slot under ``max_concurrency``; each progress notification moves it on, up to
        ``timeouts.call_max`` in all (requests.CallClock). Raises UpstreamUnavailable (not READY; the message
        names state and reason), UpstreamTimeout(upstream, "tools/call <tool>", seconds),
        UpstreamProtocolError (JSON-RPC error or invalid result). A timed-out or cancelled
        call leaves the session usable.
        """
        session = self._session(call.server)
        timeouts = session.upstream.timeouts
        clock = CallClock(call.timeout or timeouts.call, timeouts.call_max)
        token = CALL_CLOCK.set(clock)
        try:
            return await session.call_tool(dataclasses.replace(call, progress=clock.progress(call.progress)))
        finally:
            CALL_CLOCK.reset(token)

    async def list_items(self, name: str, kind: str) -> list[dict[str, Any]]:
        """Every resource, resource template or prompt (`kind`: "resources", "templates",
        "prompts") upstream `name` offers, in wire form; bounded by its timeouts.list_tools.
        Errors as `call_tool`."""
        s = self._session(name)
        method = federation.KINDS[kind][0]
        return await s.request(method, lambda c: federation.list_all(c, name, kind), s.upstream.timeouts.list_tools,
                               operation=f"list_{kind}")

    async def read_resource(self, name: str, uri: str) -> dict[str, Any]:
        """resources/read of `uri` (upstream `name`'s own URI) as a wire-form result."""
        s = self._session(name)
        with s.inbound.call("resources/read", _not_during("resources/read")):
            return await s.request("resources/read", lambda c: federation.read_resource(c, uri),
                                   operation="read_resource")

    async def get_prompt(self, name: str, prompt: str, arguments: dict[str, str] | None) -> dict[str, Any]:
        """prompts/get of upstream `name`'s own prompt `prompt` as a wire-form result."""
        s = self._session(name)
        with s.inbound.call("prompts/get", _not_during("prompts/get")):
            return await s.request(f"prompts/get {prompt}", lambda c: federation.get_prompt(c, prompt, arguments),
                                   operation="get_prompt")

    async def raise_log_level(self, level: str, levels: Sequence[str]) -> None:
        """`set_log_level(level)` when it is more verbose (earlier in `levels`) than the level
        asked for so far: upstreams get the most verbose level any client asked for (each
        client's own level is applied when relaying)."""
        if level in levels and (self.log_level is None or list(levels).index(level) < list(levels).index(self.log_level)):
            await self.set_log_level(level)

    async def set_log_level(self, level: str) -> None:
        """Ask every READY 2025-era upstream that logs for messages at `level` and above (and
        those that connect later). Failures are logged: a log level is best effort."""
        self.log_level = level
        for s in list(self._sessions.values()):
            s.log_level = level
            if s.state is UpstreamState.READY and "logging" in s.capabilities:
                if s.protocol_version in federation.MODERN:
                    continue  # 2026-07-28 has no connection-wide level: callers opt in per request
                try:
                    await s.request("logging/setLevel", lambda c: federation.set_log_level(c, level),
                                    s.upstream.timeouts.ping, operation="set_log_level")
                except Exception as exc:  # noqa: BLE001
                    logger.info("upstream %s: logging/setLevel %s failed: %s", s.name, level, exc)

    async def refresh(self, name: str) -> None:
        """Re-list ``name`` now (callback runs before this returns); on a DEGRADED upstream,
        retry the connection now instead."""
        await self._session(name).refresh()

    async def restart(self, name: str, *, timeout: float) -> UpstreamStatus:
        """Close `name`'s session (its stdio child is reaped) and start a fresh one with the
        same config, then wait up to `timeout` seconds for its first connection attempt to
        settle; returns its status then (READY, DEGRADED with the reason, or still CONNECTING).

        The swap itself is shielded: a caller that goes away mid-restart never leaves the
        upstream stopped. Raises UpstreamUnavailable for an unknown name or before the pool runs.
        """
        old = self._session(name)
        if self._tg is None:
            raise UpstreamUnavailable(f"upstream {name!r} cannot be restarted yet: the daemon is still starting")
        with anyio.CancelScope(shield=True):
            async with self._reconcile_lock:
                if self._sessions.get(name) is not old:  # a reload replaced or removed it meanwhile
                    old = self._session(name)
                logger.info("upstream %s: restarting by operator request", name)
                old.stop()
                with anyio.move_on_after(CLOSE_TIMEOUT + 5.0):
                    await old.wait_done()
                new = self._add(old.upstream)
                if self._tg is not None:
                    self._tg.start_soon(new.run, name=f"upstream:{name}")
        with anyio.move_on_after(timeout):
            await new.wait_settled()
        return self._status(new)

    async def reconcile(self, upstreams: Sequence[Upstream], *, why: str = "config reload") -> None:
        """Apply a reloaded config: start added upstreams, close removed ones, restart those
        whose config changed; unchanged ones keep their session and process. `why` is logged
        ("daemon stop" when the daemon closes them all)."""
        async with self._reconcile_lock:
            wanted = {u.name: u for u in upstreams}
            stopping: list[UpstreamSession] = []
            starting: list[Upstream] = []
            for name, s in list(self._sessions.items()):
                new = wanted.get(name)
                if new is None or new != s.upstream:
                    stopping.append(s)
                    if new is not None:
                        starting.append(new)
            for name, up in wanted.items():
                if name not in self._sessions:
                    starting.append(up)
            for s in stopping:
                logger.info("upstream %s: %s by %s", s.name, "restarting" if s.name in wanted else "removing", why)
                s.stop(STOPPED_BY.get(why, RESTARTED))
            with anyio.move_on_after(CLOSE_TIMEOUT + 5.0):
                for s in stopping:
                    await s.wait_done()
            for s in stopping:
                if self._sessions.get(s.name) is s:
                    del self._sessions[s.name]
            for up in starting:
                s = self._add(up)
                if self._tg is not None:
                    self._tg.start_soon(s.run, name=f"upstream:{s.name}")
            # Keep config order for status output.
            self._order = [u.name for u in upstreams]


def _not_during(op: str) -> Callable[[dict[str, Any]], Any]:
    async def refuse(_params: dict[str, Any]) -> dict[str, Any]:
        raise RelayRefused(f"it asked during {op}; toolatlas relays questions to the user only during a tools/call")
    return refuse


async def list_tools_once(upstream: Upstream, *, timeout: float | None = None, mode: str = "auto") -> list[ToolRecord]:
    """Connect once, list every tool (all pages), close. For `toolatlas cards generate`.

    ``timeout`` bounds the whole operation (default: timeouts.connect + timeouts.list_tools).
    Raises UpstreamTimeout, UpstreamUnavailable (cannot connect) or UpstreamProtocolError.
    """
    seconds = timeout if timeout is not None else upstream.timeouts.connect + upstream.timeouts.list_tools
    reason: str | None = None
    ended = False  # the connection ended under the listing (a stdio child that died says how)
    tools: list[ToolRecord] | None = None
    phase = "connect"
    auth = AuthWatch(upstream)
    transport = open_transport(upstream, on_eof=lambda _w: None, on_response=auth.response)
    with anyio.CancelScope(deadline=anyio.current_time() + seconds) as scope:
        try:
            async with make_client(transport, mode=mode) as client:
                try:
                    phase = "tools/list"
                    tools = await list_records(client, upstream)
                finally:
                    begin_teardown(scope)
        except UpstreamProtocolError:
            raise
        except Exception as exc:  # noqa: BLE001
            if tools is None:
                reason = f"{phase} failed: {auth.describe(exc)}"
                ended = classify(exc) is LossReason.EOF
            else:
                logger.debug("upstream %s: error while closing: %s", upstream.name, describe(exc))
    if scope.cancelled_caught and tools is None:
        raise UpstreamTimeout(upstream.name, phase, seconds)
    if tools is None:
        if ended and isinstance(transport, StdioProcess) and (exit_text := await transport.exit_reason(0.5)):
            reason = f"{phase} failed: {exit_text}"  # not the SDK's "Connection closed"
        raise UpstreamUnavailable(f"upstream {upstream.name!r}: {reason}")
    return tools


__all__ = ["Pool", "UpstreamStatus", "ToolsCallback", "list_tools_once", "UpstreamState"]
