"""What an upstream sends of its own accord, besides tool list changes: resource and prompt
list changes, log messages, and questions for the user (`elicitation/create`).

One `Inbound` per upstream lives as long as its `UpstreamSession`, across reconnects. List
changes and log messages go to the gateway's callbacks (the pool wires them). A question is
relayed to the caller whose call asked it:

- a 2026-07-28 upstream answers a call with `input_required`; for a caller that cannot take
  that (`allow_input_required` off) the SDK's driver asks the client's elicitation callback
  from the calling task, where `ASKING` names the call's relay;
- a 2025-era upstream sends `elicitation/create` on its connection, which does not say which
  call it belongs to: with one call in flight it is that call's; with several it is refused
  (the message says so and how to avoid it: `max_concurrency = 1`). Such a question is
  asked from the SDK client's own task, not the call's: when the call ends first (cancelled,
  timed out) the question is withdrawn from the caller, as the call's cancellation withdraws
  a question asked from the calling task.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

import anyio
import mcp_types
from mcp.client.session import ClientRequestContext

from toolatlas.calls import ElicitFn, LogFn
from toolatlas.errors import RelayRefused
from toolatlas.upstream.supervision import Burst

logger = logging.getLogger(__name__)

# (server, kind) -> None: "resources" or "prompts" changed upstream.
ListsCallback = Callable[[str, str], Awaitable[None]]
# (server, params) -> None: a `notifications/message` (wire form params).
LogCallback = Callable[[str, dict[str, Any]], Awaitable[None]]

ASKING: ContextVar[tuple[int, str, ElicitFn | None] | None] = ContextVar("toolatlas_asking", default=None)
# Set in the calling task by the end of a call whose question to the user was still open
# (a timeout that cuts such a call says the upstream was waiting for the user).
CUT_ASKING: ContextVar[bool] = ContextVar("toolatlas_cut_asking", default=False)

_LIST_CHANGES: dict[type, str] = {
    mcp_types.ResourceListChangedNotification: "resources",
    mcp_types.PromptListChangedNotification: "prompts",
}


async def _ignore_lists(server: str, kind: str) -> None:
    return None


async def _ignore_log(server: str, params: dict[str, Any]) -> None:
    return None


class Inbound:
    """See the module docstring."""

    def __init__(self, name: str, on_lists: ListsCallback | None = None, on_log: LogCallback | None = None) -> None:
        self.name = name
        self.on_lists = on_lists or _ignore_lists
        self.on_log = on_log or _ignore_log
        self._calls: dict[int, tuple[str, ElicitFn | None]] = {}  # in flight: (tool, relay)
        self._ended: dict[int, anyio.Event] = {}  # in flight: set when the call ends
        self._asking: set[int] = set()  # in flight with a question open
        # In flight, of callers who opted in to log messages: (relay, only a 2026-07-28 upstream's).
        self._logs: dict[int, tuple[LogFn, bool]] = {}
        self._ids = itertools.count()
        # 2026-07-28: log messages belong to the request that opted in, not to the connection.
        self.request_scoped_logs = False
        self._telling: dict[str, bool] = {}  # kind -> announced again while the gateway is told
        self._announced = {kind: Burst() for kind in _LIST_CHANGES.values()}  # log lines of list_changed

    @contextlib.contextmanager
    def call(self, tool: str, elicit: ElicitFn | None, log: LogFn | None = None,
             log_scoped_only: bool = False) -> Iterator[None]:
        """The span of one tools/call, whose questions go to `elicit` and log messages to `log`
        (with `log_scoped_only`, only a 2026-07-28 upstream's: a 2025-era caller gets a
        2025-era upstream's messages by its connection's level, through `on_log`)."""
        key = next(self._ids)
        self._calls[key] = (tool, elicit)
        ended = self._ended[key] = anyio.Event()
        if log is not None:
            self._logs[key] = (log, log_scoped_only)
        token = ASKING.set((key, tool, elicit))
        CUT_ASKING.set(False)
        try:
            yield
        finally:
            ASKING.reset(token)
            ended.set()
            if key in self._asking:
                CUT_ASKING.set(True)
                self._asking.discard(key)
            del self._calls[key], self._ended[key]
            self._logs.pop(key, None)

    async def _log(self, params: dict[str, Any]) -> None:
        """A log message: a 2025-era upstream's goes to every client that asked for its logs
        (its own level applied) and to the calls in flight that opted in; a 2026-07-28
        upstream's belongs to the one request that opted in, and is dropped when several
        did (it does not say whose it is)."""
        if not self.request_scoped_logs:
            await self.on_log(self.name, params)
        relays = [relay for relay, scoped_only in self._logs.values() if self.request_scoped_logs or not scoped_only]
        if self.request_scoped_logs and len(self._calls) > 1:
            relays = []
        for relay in relays:
            try:
                await relay(self.name, params)
            except Exception as exc:  # the caller went away
                logger.debug("upstream %s: a log message to a caller failed: %s", self.name, exc)

    async def message(self, message: object) -> bool:
        """Handle a notification other than tools/list_changed; True if it was one of ours."""
        kind = _LIST_CHANGES.get(type(message))
        if kind is not None:
            if (skipped := self._announced[kind].admit()) is not None:
                logger.info("upstream %s: %s/list_changed%s", self.name, kind,
                            f"; {skipped} more since the last one logged" if skipped else "")
            await self.changed(kind)
            return True
        if isinstance(message, mcp_types.LoggingMessageNotification):
            await self._log(message.params.model_dump(by_alias=True, mode="json", exclude_none=True))
            return True
        return False

    async def changed(self, kind: str) -> None:
        """Tell the gateway that `kind` changed. Announcements that come while it is being told
        make one more telling after it, not one each: a storm of them (each in a task of its
        own) had every client sent as many list_changed, all at once."""
        if kind in self._telling:
            self._telling[kind] = True
            return
        self._telling[kind] = False
        try:
            while True:
                try:
                    await self.on_lists(self.name, kind)
                except Exception:  # a consumer bug must not take the session down
                    logger.exception("upstream %s: the %s change callback raised", self.name, kind)
                if not self._telling[kind]:
                    return
                self._telling[kind] = False
        finally:
            del self._telling[kind]

    def _asker(self) -> tuple[int, str, ElicitFn | None, bool]:
        """The call a 2025-era upstream's question belongs to (its key, tool, relay, and
        whether it is asked from the call's own task), or RelayRefused saying why none can be told. A
        call whose question is still open waits for its answer, so it is not the one asking
        (a 2026-07-28 caller that left an input_required unanswered can call again)."""
        asking = ASKING.get()
        if asking is not None:
            return (*asking, True)
        if not self._calls:
            raise RelayRefused("it arrived while no tools/call of the upstream was in flight through toolatlas; "
                               "toolatlas relays questions only during a tool call")
        calls = [(key, *call, False) for key, call in self._calls.items() if key not in self._asking]
        if len(calls) != 1:
            raise RelayRefused(
                f"{len(self._calls)} calls were in flight on the upstream and MCP 2025-11-25 does not say which one "
                f"asked; set max_concurrency = 1 in [[upstream]] {self.name!r} so that toolatlas can tell")
        return calls[0]

    async def elicit(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """The SDK client's elicitation callback: relay the question to the asking caller."""
        tool = "?"
        try:
            key, tool, relay, own_task = self._asker()
            if relay is None:
                raise RelayRefused("the caller (a plain socket client or the toolatlas CLI) cannot be asked")
            question = relay(params.model_dump(by_alias=True, mode="json", exclude_none=True))
            self._asking.add(key)
            try:
                answer = await (question if own_task else _unless_ended(question, self._ended[key]))
            except anyio.get_cancelled_exc_class():
                raise  # the call ends with its question open: its end reads `_asking`
            except BaseException:
                self._asking.discard(key)
                raise
            self._asking.discard(key)
            return mcp_types.ElicitResult.model_validate(answer)
        except RelayRefused as exc:
            message = f"toolatlas cannot relay upstream {self.name!r}'s elicitation/create (tool {tool!r}): {exc}"
            logger.info("%s", message)
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=message)
        except Exception as exc:  # the caller went away, or answered with something invalid
            logger.info("upstream %s: relaying an elicitation failed: %s", self.name, exc)
            return mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR,
                                       message=f"toolatlas could not get the caller's answer: {exc}")


async def _unless_ended(ask: Awaitable[dict[str, Any]], ended: anyio.Event) -> dict[str, Any]:
    """The caller's answer; cancelled (so withdrawn from the caller) when `ended` is set first."""
    answer: dict[str, Any] | None = None
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await ended.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            answer = await ask
        except Exception as exc:  # raised as itself below, not in the task group's ExceptionGroup
            failed = exc
        tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
    if answer is None:
        raise RelayRefused("the tool call ended (cancelled or timed out) before the caller answered")
    return answer


__all__ = ["ASKING", "CUT_ASKING", "Inbound", "ListsCallback", "LogCallback"]
