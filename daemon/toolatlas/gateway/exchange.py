"""A 2025-era upstream's mid-call question, turned into 2026-07-28 `input_required` rounds.

A 2025-11-25 upstream asks the user with an `elicitation/create` request while its tools/call
is still running; a 2026-07-28 client cannot take server requests and answers questions by
retrying the call with `inputResponses` instead. For such a pair the gateway runs the upstream
call in the background (`Exchange.run`), answers the client `input_required` with the
question, keeps the call parked (`Parked`) under a key sealed into its requestState, and
hands the retry's answer to the waiting `elicitation/create`. The call then goes on: to its
result, or to the next question (another round).

A parked call the client never comes back for ends when the upstream call's own timeout
(timeouts.call, which covers the time spent waiting for the user) fires, or at the latest
after `Parked.ttl` seconds; its question is then answered with an error.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from toolatlas.calls import UpstreamReply
from toolatlas.errors import BadInput, RelayRefused
from toolatlas.gateway.ports import Connection

log = logging.getLogger(__name__)

REQUEST_KEY = "toolatlas-elicitation"  # the inputRequests key of a relayed question


def wire(value: Any) -> Any:
    """An SDK model (an input response from the client) as its wire dict; others as they are."""
    dump = getattr(value, "model_dump", None)
    return dump(by_alias=True, mode="json", exclude_none=True) if callable(dump) else value


class Exchange:
    """One upstream call of a 2026-07-28 caller whose upstream may ask mid-call."""

    def __init__(self, ttl: float, owner: tuple[Connection | None, str] = (None, "")) -> None:
        """`owner`: the caller's connection and the upstream, for a reload that withdraws it."""
        self.owner = owner
        self.key = secrets.token_urlsafe(16)
        self.ttl = ttl
        self.expires = time.monotonic() + ttl
        self.scope = anyio.CancelScope()
        self._send, self._events = anyio.create_memory_object_stream[tuple[str, Any]](4)
        self._answered = anyio.Event()
        self._answer: Any = None

    async def run(self, route: Callable[[], Awaitable[UpstreamReply]]) -> None:
        """The upstream call, in the background: its end (or failure) becomes the last event."""
        with self.scope:
            try:
                reply = await route()
            except Exception as exc:  # noqa: BLE001 - handed to the caller as is
                self._post(("failed", exc))
            else:
                self._post(("done", reply))

    def _post(self, event: tuple[str, Any]) -> None:
        try:
            self._send.send_nowait(event)
        except (anyio.WouldBlock, anyio.ClosedResourceError):
            log.debug("exchange %s: nobody is waiting for %s", self.key[:6], event[0])

    async def ask(self, params: dict[str, Any]) -> dict[str, Any]:
        """The upstream's elicitation/create: posted as a question, answered by `answer`."""
        self._answered = anyio.Event()
        self.expires = time.monotonic() + self.ttl
        self._post(("ask", params))
        with anyio.move_on_after(self.ttl):
            await self._answered.wait()
            answer: dict[str, Any] = self._answer
            return answer
        raise RelayRefused(f"the caller did not answer the question within {self.ttl:g} s")

    def answer(self, value: Any) -> None:
        self._answer = wire(value)
        self._answered.set()

    async def next(self) -> tuple[str, Any]:
        """("ask", params), ("done", reply) or ("failed", exception)."""
        return await self._events.receive()

    def close(self) -> None:
        self.scope.cancel()
        self._send.close()
        self._events.close()


class Parked:
    """Exchanges waiting for their caller's retry, by key; expired ones are dropped."""

    def __init__(self, ttl: float = 600.0) -> None:
        self.ttl = ttl
        self._waiting: dict[str, Exchange] = {}

    def park(self, ex: Exchange) -> None:
        now = time.monotonic()
        for key, old in list(self._waiting.items()):
            if old.expires < now:
                del self._waiting[key]
                old.close()
        self._waiting[ex.key] = ex

    def waiting(self, key: str) -> bool:
        return key in self._waiting

    def end(self, which: Callable[[Exchange], bool]) -> int:
        """Close the parked exchanges `which` picks (their upstream calls are cancelled, a
        retry is told the call is no longer waiting); how many."""
        ended = [key for key, ex in self._waiting.items() if which(ex)]
        for key in ended:
            self._waiting.pop(key).close()
        return len(ended)

    def resume(self, key: str, responses: Any) -> Exchange:
        """The exchange `key` names, with the answer from `responses` handed to its question;
        BadInput when it is gone or the answer is missing."""
        ex = self._waiting.pop(key, None)
        if ex is None:
            raise BadInput("the call this answers is no longer waiting (it ended or timed out); call the tool again")
        answer = (responses or {}).get(REQUEST_KEY)
        if answer is None:
            self._waiting[key] = ex
            raise BadInput(f"inputResponses must answer {REQUEST_KEY!r}, the question of the input_required result")
        ex.answer(answer)
        return ex


__all__ = ["REQUEST_KEY", "Exchange", "Parked", "wire"]
