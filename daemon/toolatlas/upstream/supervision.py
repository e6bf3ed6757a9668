"""Supervision of one READY session: health checks, the 2026-07-28 listen stream, re-lists.

The owner task (``session.py``) connects and tears down; while a session is READY it runs
these watchers in its task group. They never end a session themselves: each reports a
typed `Loss` to the session (`Supervised.mark_lost`), which leaves READY and reconnects.

- health: legacy upstreams get a ping every `ping_interval`; 2026-07-28 has no ping, so a
  `server/discover` stands in. A check unanswered while calls are in flight gets one more
  chance at the next interval (a server busy with a large result answers late, and each call
  has its own timeout); two in a row, or one while idle, lose the session. A re-list that
  times out is judged the same way.
- listen: on 2026-07-28 a `subscriptions/listen` stream stays open; an event, or a drop
  (no replay), means re-list; LISTEN_MAX_FAILURES failed re-opens mean the session is lost.
- relist: one worker re-lists on request (list_changed, listen, the `relist_interval`
  timer, an operator's refresh) and hands a changed list to the session.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.abc
import mcp_types
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged
from mcp.shared.exceptions import MCPError

from toolatlas.catalog.model import ToolRecord
from toolatlas.config import Upstream
from toolatlas.errors import UpstreamProtocolError, UpstreamTimeout
from toolatlas.backoff import backoff_delay
from toolatlas.upstream.client import Loss, LossReason, Phase, phase_timeout
from toolatlas.upstream.listing import LISTING_GATE, converted, list_all_tools

logger = logging.getLogger(__name__)

# Consecutive failed re-listens of subscriptions/listen before the session counts as lost.
LISTEN_MAX_FAILURES = 3
# Pause between listen re-opens: backoff_delay(failures, base=..., cap=...).
LISTEN_RETRY_BASE = 0.1
LISTEN_RETRY_CAP = 2.0
# Seconds between log lines about an upstream's tools/list_changed announcements (see Burst).
LOG_INTERVAL = 60.0


class Burst:
    """Log lines for a burst of like events: the first, then at most one per `interval`
    seconds, which counts the ones left unlogged since the last."""

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        self.interval = interval
        self._skipped = 0
        self._next = -math.inf

    def admit(self) -> int | None:
        """None: leave this one unlogged; else log it, saying this many were left unlogged."""
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return None
        skipped, self._skipped, self._next = self._skipped, 0, now + self.interval
        return skipped


class Supervised(Protocol):
    """What the watchers need from the session they watch."""

    @property
    def name(self) -> str: ...

    @property
    def upstream(self) -> Upstream: ...

    @property
    def tools(self) -> list[ToolRecord] | None: ...

    def mark_lost(self, loss: Loss) -> None: ...

    def classify(self, exc: BaseException) -> LossReason: ...

    def describe(self, exc: BaseException) -> str: ...

    def observe_list_changed(self) -> None: ...

    async def lists_changed(self, kind: str) -> None:
        """The upstream's "resources" or "prompts" changed (a listen event)."""
        ...

    async def publish(self, tools: list[ToolRecord] | None) -> None: ...


class Supervision:
    """The watchers of one upstream; lives as long as its session object, across connections.

    The re-list bookkeeping (requests, completions) outlives a connection so that an
    operator's `relist_now` can wait for "a re-list that started after I asked".
    """

    def __init__(self, session: Supervised, in_flight: Callable[[], int] = lambda: 0) -> None:
        self._s = session
        self._in_flight = in_flight  # requests holding one of the session's max_concurrency slots
        self._wanted = anyio.Event()
        self._started = 0
        self._done = 0
        self._done_evt = anyio.Event()
        self._force_publish = False
        self._announced = Burst()

    def want_relist(self) -> None:
        self._wanted.set()

    def tools_changed(self, how: str) -> None:
        """The upstream said its tools changed (`how`: a notification, a listen event): re-list.
        Logged once per LOG_INTERVAL with a count of the rest: a server announcing a change
        hundreds of times a second wrote as many log lines (the re-lists coalesce anyway)."""
        self._s.observe_list_changed()
        self.want_relist()
        skipped = self._announced.admit()
        if skipped is not None:
            logger.info("upstream %s: its tools changed (%s)%s", self._s.name, how,
                        f"; {skipped} more announcements since the last one logged" if skipped else "")

    async def run(self, client: Client, tg: anyio.abc.TaskGroup, *, modern: bool) -> None:
        """Start the relist worker, the relist timer and the health check in `tg`."""
        up = self._s.upstream
        tg.start_soon(self._relist_worker, client)
        if up.relist_interval > 0:
            tg.start_soon(self._relist_timer, up.relist_interval)
        if up.ping_interval > 0:
            tg.start_soon(self._health_loop, client, modern)

    def _excused(self, excused: bool, failure: str, then: str) -> bool:
        """Whether a health check or re-list that went unanswered (`failure`) is excused:
        once, while calls are in flight. Busy, maybe not hung: a single-threaded server
        serialising a large result answers nothing else meanwhile, and ending the session
        would fail the very call it is busy with (which has its own timeout). `excused`: the
        last one was; two in a row, or one while idle, are not. Logs an excuse with `then`."""
        busy = self._in_flight()
        if not busy or excused:
            return False
        logger.warning("%s, with %d call(s) in flight; %s", failure, busy, then)
        return True

    # ---- health -----------------------------------------------------------------------

    async def _health_loop(self, client: Client, modern: bool) -> None:
        up = self._s.upstream
        op = "server/discover (health check)" if modern else "ping"
        excused = False  # the last check went unanswered while calls were in flight
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
                excused = False
            except TimeoutError:
                timeout = UpstreamTimeout(self._s.name, op, up.timeouts.ping)
                excused = self._excused(excused, str(timeout), f"checking again in {up.ping_interval:g} s")
                if excused:
                    continue
                self._s.mark_lost(Loss(LossReason.HEALTH_CHECK, f"health check failed: {timeout}"))
                return
            except Exception as exc:  # noqa: BLE001
                self._s.mark_lost(Loss(LossReason.HEALTH_CHECK, f"health check failed: {op}: {self._s.describe(exc)}"))
                return

    # ---- listen (2026-07-28) ----------------------------------------------------------

    async def listen(
        self, client: Client, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep a `subscriptions/listen` stream open; every event means re-list.

        Signals started once the first stream is acknowledged (or listening proved
        impossible), so the caller can list tools knowing no change slips in between.
        Raises UpstreamProtocolError when the first stream cannot be opened at all.
        """
        name, up = self._s.name, self._s.upstream
        failures = 0
        first = True
        started = False
        while True:
            try:
                with anyio.CancelScope(deadline=anyio.current_time() + up.timeouts.ping) as ack:
                    async with client.listen(tools_list_changed=True, prompts_list_changed=True,
                                             resources_list_changed=True) as sub:
                        ack.deadline = math.inf
                        failures = 0
                        if not started:
                            started = True
                            task_status.started()
                        if not first:
                            # No replay after a drop: whatever changed meanwhile needs a refetch.
                            self.want_relist()
                            for kind in ("resources", "prompts"):
                                await self._s.lists_changed(kind)
                        first = False
                        async for event in sub:
                            if isinstance(event, (PromptsListChanged, ResourcesListChanged)):
                                await self._s.lists_changed("prompts" if isinstance(event, PromptsListChanged)
                                                            else "resources")
                                continue
                            self.tools_changed("a listen event")
                if ack.cancelled_caught:
                    raise TimeoutError(f"no subscriptions/listen acknowledgment within {up.timeouts.ping:g} s")
                logger.debug("upstream %s: listen stream closed by the server; re-listening", name)
            except ListenNotSupportedError:
                if not started:
                    task_status.started()
                return
            except MCPError as exc:
                if exc.error.code == mcp_types.METHOD_NOT_FOUND:
                    logger.info("upstream %s: no subscriptions/listen; relying on polling", name)
                    if not started:
                        task_status.started()
                    return
                failures += 1
                last = self._s.describe(exc)
            except Exception as exc:  # noqa: BLE001 - SubscriptionLost, TimeoutError, transport errors
                failures += 1
                last = self._s.describe(exc)
            else:
                failures += 1
                last = "listen stream closed"
            if failures >= LISTEN_MAX_FAILURES:
                if not started:
                    raise UpstreamProtocolError(
                        f"upstream {name!r}: subscriptions/listen failed {failures} times: {last}"
                    )
                self._s.mark_lost(Loss(LossReason.LISTEN, f"subscriptions/listen lost {failures} times: {last}"))
                return
            await anyio.sleep(backoff_delay(failures, base=LISTEN_RETRY_BASE, cap=LISTEN_RETRY_CAP))

    # ---- relist -----------------------------------------------------------------------

    async def _relist_timer(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            self.want_relist()

    async def _relist_worker(self, client: Client) -> None:
        s = self._s
        excused = False  # the last re-list timed out while calls were in flight (see health)
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            self._started += 1
            seq = self._started
            phase = Phase("tools/list", s.upstream.timeouts.list_tools)
            try:
                async with LISTING_GATE.turn(s.upstream):
                    with anyio.fail_after(s.upstream.timeouts.list_tools):
                        listed = await list_all_tools(client, s.upstream.name, phase.paged)
                    # the upstream answered: converting is this daemon's own work, not bounded by its timeout
                    tools = await converted(s.upstream, listed)
                    del listed  # the SDK's models: not kept until the next re-list
                excused = False
            except TimeoutError:
                loss = phase_timeout(s.name, phase)
                excused = self._excused(excused, loss.text, f"keeping {len(s.tools or ())} tools and listing again")
                if not excused:
                    s.mark_lost(loss)
                    return
                self.want_relist()
            except Exception as exc:  # noqa: BLE001
                reason = s.classify(exc)
                if reason.session_gone:
                    s.mark_lost(Loss(reason, f"tools/list failed: {s.describe(exc)}"))
                    return
                # A server bug in listing keeps the last good catalog.
                logger.warning("upstream %s: re-list failed, keeping %d tools: %s",
                               s.name, len(s.tools or ()), s.describe(exc))
            else:
                forced, self._force_publish = self._force_publish, False
                if s.tools is None or forced or tools != s.tools:
                    if not forced:
                        logger.info("upstream %s: tool list changed: %d tools", s.name, len(tools))
                    await s.publish(tools)
            self._done = seq
            evt, self._done_evt = self._done_evt, anyio.Event()
            evt.set()

    async def relist_now(self, lost: anyio.Event, ready: Callable[[], bool], seconds: float) -> bool:
        """Ask for a re-list that hands the list over even when unchanged, and wait for it.

        True once it finished; False when `lost` is set or `ready()` turns false first.
        Raises UpstreamTimeout(upstream, "tools/list (refresh)", seconds).
        """
        target = self._started + 1
        self._force_publish = True
        self.want_relist()
        with anyio.move_on_after(seconds) as scope:
            while self._done < target:
                evt = self._done_evt
                if lost.is_set() or not ready():
                    return False
                async with anyio.create_task_group() as tg:
                    async def watch_lost() -> None:
                        await lost.wait()
                        tg.cancel_scope.cancel()
                    tg.start_soon(watch_lost)
                    await evt.wait()
                    tg.cancel_scope.cancel()
        if scope.cancelled_caught:
            raise UpstreamTimeout(self._s.name, "tools/list (refresh)", seconds)
        return True
