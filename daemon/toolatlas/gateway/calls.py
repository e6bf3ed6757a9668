"""execute_tool and direct calls: resolve the name, check access and arguments, open the
sealed input state, route one `UpstreamCall` over the owner's warm session, and count it."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from dataclasses import replace

import anyio

from toolatlas import events as ev
from toolatlas.calls import CallOutcome, CallRequest, InputRequired, UpstreamCall, UpstreamReply
from toolatlas.catalog.model import ToolRecord
from toolatlas.catalog.validate import ArgumentValidator
from toolatlas.errors import BadInput, ToolatlasError, UpstreamTimeout, UpstreamUnavailable
from toolatlas.gateway.audit import TEXT_CHARS, bookkeep, deny, shown, via, who
from toolatlas.gateway.catalog import LiveCatalog
from toolatlas.gateway.exchange import REQUEST_KEY, Exchange, Parked
from toolatlas.gateway.ports import Connection
from toolatlas.gateway.suggest import NameIndexes, suggest
from toolatlas.gateway.visibility import Visibility
from toolatlas.inputstate import InputStateSealer
from toolatlas.jsonlines import MAX_DEPTH, deeper_than
from toolatlas.meta_tools import META_NAMES
from toolatlas.metrics import Metrics
from toolatlas.names import MAX_LEN, split
from toolatlas.redact import Redactor

# The execute_tool outcome label of each error class (first match wins).
_CALL_OUTCOMES: tuple[tuple[type[ToolatlasError], str], ...] = (
    (BadInput, "bad_input"),
    (UpstreamTimeout, "timeout"),
    (UpstreamUnavailable, "unavailable"),
    (ToolatlasError, "error"),
)

# A name longer than this gets no "did you mean" (a trigram set and difflib over a 1 MB name
# took 4.6 s of CPU, holding the GIL, per call).
SUGGEST_MAX_CHARS = 4 * MAX_LEN

Route = Callable[[UpstreamCall], Awaitable[UpstreamReply]]
# Starts a background task (the gateway's task group); None when the gateway is not running.
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]
Availability = Callable[[str], str]  # server -> "state: reason" for an unavailable upstream
NotListed = Callable[[str], "str | None"]  # server -> why its tools are not known yet, or None


class CallService:
    """Routes calls; tracks calls in flight so a drain can wait for them."""

    def __init__(
        self, catalog: LiveCatalog, visibility: Visibility, route: Route, availability: Availability, *,
        metrics: Metrics, events: ev.Events, redactor: Redactor | None = None, not_listed: NotListed | None = None,
        asks_mid_call: Callable[[str], bool] = lambda _server: False, spawn: Callable[[], Spawn | None] = lambda: None,
        session_ready: Callable[[str], bool] | None = None, held: Callable[[str], str | None] = lambda _server: None,
    ) -> None:
        """`not_listed(server)`: why a configured upstream's tools are not known yet (it is
        still connecting), so a call to one of them is told to retry, not that it is unknown.
        `session_ready(server)`: its warm session is up (the pool says READY).
        `asks_mid_call(server)`: the upstream is on a 2025-era protocol, whose questions
        come as requests during the call (translated for 2026-07-28 callers, see exchange).
        `held(server)`: why a configured upstream serves nothing now (awaiting the operator's
        approval, or rejected), or None; a caller its access rules give it is told so."""
        self._held = held
        self._asks_mid_call, self._spawn = asks_mid_call, spawn
        self._parked = Parked()
        self._redact = redactor or events.redactor
        self._not_listed = not_listed or (lambda _server: None)
        self._session_ready = session_ready or (lambda _server: False)
        self._catalog = catalog
        self._visibility = visibility
        self._route = route
        self._availability = availability
        self._metrics = metrics
        self._events = events
        self._validator = ArgumentValidator()
        self._sealer = InputStateSealer()
        self._name_indexes = NameIndexes()  # for "Did you mean"; those of removed servers go as the catalog changes
        catalog.on_change.append(self._let_go)
        self.inflight = 0
        self._running: dict[anyio.CancelScope, tuple[Connection, str]] = {}  # calls in flight: caller, upstream
        self._withdrawn: dict[anyio.CancelScope, tuple[str, bool]] = {}  # those `withdraw` ended: why, denied
        self.draining = False
        # Hears how each call ended: (connection, tool name, ok: no error, no isError). Set by the gateway (learning).
        self.on_done: Callable[[Connection, str, bool], None] | None = None
        self._idle: anyio.Event | None = None  # made by a drain that waits, set by the last call out

    def withdraw(self, why: str, *, hold: bool = False) -> int:
        """Cancel the calls in flight whose caller may no longer use their upstream: each ends
        at once, told `why`, and its upstream request is cancelled, as a removed token's
        requests end. `hold` False: those the caller's access rules (or its endpoint) no
        longer give it, after a reload (an access denial each); True: those the operator's
        approval decision holds now (no denial). How many."""
        def taken(conn: Connection, server: str) -> bool:
            # an upstream the config no longer has is withdrawn from no one: the pool closes
            # it, and its calls end saying so (as do those of one a reload restarts)
            if not self._visibility.configured(server) or server in self._visibility.allowed_servers(conn):
                return False
            return (server in self._visibility.permitted(conn)) is hold

        ended = [scope for scope, (conn, server) in self._running.items() if taken(conn, server)]
        for scope in ended:
            self._withdrawn[scope] = (why, not hold)
            scope.cancel()
        # a call parked on its upstream's question, waiting for the caller's answer, ends too
        return len(ended) + self._parked.end(lambda ex: ex.owner[0] is not None and taken(ex.owner[0], ex.owner[1]))

    async def wait_idle(self, timeout: float) -> None:
        """Wait (bounded) until no call is in flight."""
        with anyio.move_on_after(timeout):
            while self.inflight:
                if self._idle is None:
                    self._idle = anyio.Event()
                await self._idle.wait()

    async def execute(self, call: CallRequest, conn: Connection) -> CallOutcome:
        """Route `call` to the owning upstream. For 2026-07-28 callers an upstream's
        input_required reaches them with the gateway's sealed state, and their retry goes
        back to the same upstream. Raises BadInput / UpstreamUnavailable / UpstreamTimeout
        with a message a model can act on."""
        t0 = time.perf_counter()
        rec = self._catalog.view.by_name.get(call.name)
        allowed = self._visibility.allowed_servers(conn)
        # A refused call is labelled "unknown": metrics must not confirm a server the caller may not use.
        server = rec.server if rec is not None and rec.server in allowed else "unknown"
        try:
            outcome = await self._execute(call, conn, allowed)
        except ToolatlasError as exc:
            # Its message reaches the client: an upstream's reason may quote its stderr or URL.
            self._redact.exception(exc)
            label = next(o for cls, o in _CALL_OUTCOMES if isinstance(exc, cls))
            self._done(time.perf_counter() - t0, server, label, exc, call.name, conn, False)
            parsed = split(call.name)
            if isinstance(exc, BadInput) and parsed and parsed[0] not in allowed and self._visibility.configured(parsed[0]):
                deny(self._events, self._metrics, conn, via(), call.name,
                     f"{conn.principal} may not use upstream {parsed[0]!r}")
            raise
        # The metrics, the event line and the learning feedback after the reply (or before it
        # with an audit trail).
        bookkeep(self._events, ev.EXECUTE_TOOL_COMPLETED, functools.partial(
            self._done, time.perf_counter() - t0, server, "error" if outcome.is_error else "ok", None, call.name, conn,
            not outcome.is_error and outcome.input_required is None))
        return outcome

    def _done(self, seconds: float, server: str, outcome: str, exc: BaseException | None, name: str,
              conn: Connection, worked: bool) -> None:
        """A call's metrics and event line, then `on_done` (learning: `worked` = succeeded)."""
        upstream = server if server in self._catalog.view.servers else "unknown"
        self._metrics.observe_execute(seconds, upstream=upstream, outcome=outcome)
        self._metrics.count_endpoint_request(conn.endpoint, "call")
        latency_ms = round(seconds * 1000, 3)
        if exc is not None:
            self._metrics.count_error(type(exc).__name__)
            self._events.emit(ev.EXECUTE_TOOL_FAILED, name=name[:TEXT_CHARS], upstream=upstream, via=via(),
                              outcome=outcome, error_class=type(exc).__name__, message=_logged(exc)[: ev.MESSAGE_CHARS],
                              latency_ms=latency_ms, **who(conn))
        else:
            self._events.emit(ev.EXECUTE_TOOL_COMPLETED, name=name[:TEXT_CHARS], upstream=upstream, via=via(),
                              outcome=outcome, latency_ms=latency_ms, **who(conn))
        if self.on_done is not None:
            self.on_done(conn, name, worked)

    async def _resolve(self, name: str, allowed: set[str], conn: Connection) -> ToolRecord:
        """The record `conn`, who may use `allowed`, may call by `name`, or BadInput /
        UpstreamUnavailable."""
        view = self._catalog.view
        rec = view.by_name.get(name)
        if rec is None or rec.server not in allowed:
            parsed = split(name)
            if parsed and parsed[0] in allowed:
                reason = view.quarantine_reason(parsed[0], parsed[1])
                if reason:
                    raise BadInput(f"tool {shown(name)} is quarantined: {reason}")
                starting = self._not_listed(parsed[0])
                if starting:
                    raise UpstreamUnavailable(f"tool {shown(name)} cannot be called yet: {starting}")
            elif parsed and (held := self._held(parsed[0])) and parsed[0] in self._visibility.permitted(conn):
                # its access rules give it this upstream (catalog_status shows it): no denial, the operator's hold
                raise UpstreamUnavailable(f"tool {shown(name)} cannot be called: upstream {parsed[0]!r} serves "
                                          f"nothing now ({held})")
            raise BadInput(await self._unknown_tool_message(name, allowed))
        if not view.server(rec.server).available and not self._session_ready(rec.server):
            # A live session whose listing is still being indexed (the view's interim keeps
            # the server out of search until the swap) is called: the record came from that
            # listing, and "tools that are not yet indexed are called normally".
            raise UpstreamUnavailable(
                f"server {rec.server!r} is not available right now ({self._availability(rec.server)}); try again later"
            )
        return rec

    async def _execute(self, call: CallRequest, conn: Connection, allowed: set[str]) -> CallOutcome:
        if self.draining:
            raise UpstreamUnavailable("the gateway is shutting down; retry in a moment")
        rec = await self._resolve(call.name, allowed, conn)
        arguments = _arguments(call.arguments)
        problems = await self._validator.check_async(rec, arguments or {})
        if problems:
            said = f"arguments for {rec.name!r} do not match its inputSchema: "
            raise BadInput(said + "; ".join(p.shown for p in problems) + ". Fix these and call again.",
                               logged=said + "; ".join(p.logged for p in problems))
        upstream_state: str | None = None
        park: str | None = None
        if call.allow_input_required and call.request_state is not None:
            owner, upstream_state, park = self._sealer.open_parked(call.request_state, tool=rec.name,
                                                                   principal=conn.principal)
            if owner != rec.server:  # sealed with the tool's name, so this means a reload moved it
                raise BadInput("requestState belongs to another upstream; call the tool again without it")
        elif call.allow_input_required and call.input_responses:
            raise BadInput("inputResponses need the requestState of the input_required result they answer")
        if park is not None:
            try:
                resumed = self._parked.resume(park, call.input_responses)
            except BadInput:
                if self._parked.waiting(park) and call.request_state:  # not answered: the call still waits,
                    self._sealer.release(call.request_state)  # so its state stays good for the retry that answers
                raise
            return await self._converse(resumed, rec, conn)
        spawn = self._spawn()
        exchange = None
        if call.allow_input_required and call.elicit is None and spawn is not None and self._asks_mid_call(rec.server):
            exchange = Exchange(self._parked.ttl, (conn, rec.server))
        routed = UpstreamCall(
            server=rec.server, tool=rec.tool, arguments=arguments, progress=call.progress,
            allow_input_required=call.allow_input_required,
            input_responses=call.input_responses if call.allow_input_required else None,
            request_state=upstream_state, elicit=exchange.ask if exchange is not None else call.elicit,
            log=call.log, log_level=call.log_level, log_scoped_only=call.log_scoped_only, raw=call.raw,
        )
        self.inflight += 1
        running = anyio.CancelScope()
        self._running[running] = (conn, rec.server)
        try:
            with running:
                if exchange is not None and spawn is not None:
                    spawn(lambda: exchange.run(lambda: self._route(routed)))
                    return await self._converse(exchange, rec, conn)
                reply = await self._route(routed)
        finally:
            del self._running[running]
            withdrawn = self._withdrawn.pop(running, None)
            self.inflight -= 1
            if self.inflight == 0 and self._idle is not None:
                self._idle.set()
                self._idle = None
        if running.cancelled_caught and withdrawn is not None:  # `withdraw`: the upstream was taken from this caller
            why, denied = withdrawn
            if denied:
                deny(self._events, self._metrics, conn, via(), rec.name,
                     f"{conn.principal} may no longer use upstream {rec.server!r} ({why}); the call in flight was cancelled")
            raise UpstreamUnavailable(f"the call of {rec.name!r} was cancelled: {why} while it ran, and you may no "
                                      "longer use this tool")
        if reply.input_required is not None:
            sealed = self._sealer.seal(upstream=rec.server, tool=rec.name, principal=conn.principal,
                                       upstream_state=reply.input_required.request_state)
            return replace(reply, input_required=InputRequired(reply.input_required.input_requests, sealed))
        return reply

    async def _converse(self, ex: Exchange, rec: ToolRecord, conn: Connection) -> CallOutcome:
        """The next turn of a translated call: its result, or its next question as an
        input_required whose sealed state names the parked call."""
        try:
            kind, value = await ex.next()
        except BaseException:  # the caller went away (or was cancelled): so does the upstream call
            ex.close()
            raise
        if kind == "ask":
            self._parked.park(ex)
            sealed = self._sealer.seal(upstream=rec.server, tool=rec.name, principal=conn.principal,
                                       upstream_state=None, park=ex.key)
            question = {REQUEST_KEY: {"method": "elicitation/create", "params": value}}
            return CallOutcome(input_required=InputRequired(question, sealed))
        ex.close()
        if kind == "failed":
            raise value
        reply: CallOutcome = value
        return reply

    async def _let_go(self) -> None:
        self._name_indexes.keep(lambda server: self._catalog.view.server(server).records)

    async def _unknown_tool_message(self, name: str, allowed: set[str]) -> str:
        if name in META_NAMES:  # execute_tool {"name": "tool_search"}: "unknown, use tool_search" reads as a loop
            return f"{name} is one of the gateway's own tools, not an upstream's: call {name} itself, not through execute_tool."
        if len(name) > SUGGEST_MAX_CHARS:  # no gateway name is this long: nothing is close to it
            return f"unknown tool {shown(name)} ({len(name)} characters; a tool name has at most {MAX_LEN}). " \
                   "Use tool_search to find tools."
        view = self._catalog.view
        indexes = await self._name_indexes.of({s: e.records for s, e in view.servers.items() if s in allowed and e.records})
        by_name = view.by_name
        close = await anyio.to_thread.run_sync(suggest, name, indexes, lambda n: by_name[n].tool if n in by_name else n)
        hint = f" Did you mean: {', '.join(close)}?" if close else " Use tool_search to find tools."
        return f"unknown tool {shown(name)}.{hint}"


def _logged(exc: BaseException) -> str:
    """`exc`'s message as events and the audit trail keep it: argument values left out."""
    return exc.logged if isinstance(exc, BadInput) else str(exc)


def _arguments(raw: object) -> dict[str, object] | None:
    """A call's arguments as an object: a JSON string is decoded (held to the nesting the
    socket allows a message); anything else is BadInput."""
    if isinstance(raw, str):
        too_deep = f"`arguments` nests arrays and objects more than {MAX_DEPTH} levels deep; send flatter arguments"
        try:
            raw = json.loads(raw)
        except RecursionError as exc:  # deeper than the decoder goes, far past MAX_DEPTH
            raise BadInput(too_deep) from exc
        except ValueError as exc:
            raise BadInput(f"`arguments` is a string that is not valid JSON: {exc}") from exc
        if deeper_than(raw, MAX_DEPTH):
            raise BadInput(too_deep)
    if raw is not None and not isinstance(raw, dict):
        raise BadInput(f"`arguments` must be an object, got {type(raw).__name__}")
    return raw


__all__ = ["CallService"]
