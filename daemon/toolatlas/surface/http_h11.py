"""uvicorn's h11 protocol for the HTTP endpoint, with the header and body timeouts uvicorn
lacks (a slowloris peer is closed after [daemon] message_timeout)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from toolatlas.surface.rpccheck import Refusal

log = logging.getLogger("toolatlas.surface.http")  # the endpoint's own log name, as before


def bounded_h11(timeout: Callable[[], float]) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with header and body timeouts, which uvicorn lacks: a connection
    whose request headers have not all arrived `timeout()` seconds after it opened, or after
    its last response, is closed (a peer that connects and sends nothing, or trickles headers,
    would otherwise hold it forever); so is one whose request body has not all arrived
    `timeout()` seconds after its headers (answered 408 first when no response has started).
    A request being served (an SSE stream) is not cut."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        _body_timer: asyncio.TimerHandle | None = None

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self._body_timer is not None and (self.cycle is not cycle or self.conn.their_state is not h11.SEND_BODY):
                self._body_timer.cancel()  # the body is in: the timer (and the request it holds) goes
                self._body_timer = None
            if self.cycle is not cycle and self.conn.their_state is h11.SEND_BODY:  # a request, its body to come
                self._body_timer = self.loop.call_later(timeout(), self._body_deadline, self.cycle)

        def _body_deadline(self, cycle: Any) -> None:
            if cycle is not self.cycle or self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
                return
            log.info("closing an HTTP connection from %s: its request body did not all arrive within %g s "
                     "([daemon] message_timeout)", self.client, timeout())
            if not cycle.response_started:
                body = Refusal(-32600, f"the request body did not all arrive within {timeout():g} s "
                               "([daemon] message_timeout); the connection is closed").line()
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self.loop.call_later(timeout(), self._header_deadline)

        def _header_deadline(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.info("closing an HTTP connection from %s: no complete request headers within %g s "
                         "([daemon] message_timeout)", self.client, timeout())
                self.transport.close()

    return BoundedH11Protocol


__all__ = ["bounded_h11"]
