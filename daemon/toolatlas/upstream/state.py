"""The per-upstream lifecycle: states, an explicit transition table, and a pure `decide`.

The owner task (``session.py``) feeds events in and carries out the actions `decide`
returns; nothing here does I/O, so the table is unit-tested on its own.

    DISABLED                      (enabled = false in config; never connects)
    CONNECTING --connected-->     READY
    CONNECTING --connect_failed-> DEGRADED   (withdraw nothing: it never published)
    READY      --lost-->          DEGRADED   (withdraw tools, close session, schedule retry)
    DEGRADED   --retry-->         CONNECTING
    any        --close-->         CLOSED     (final)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class UpstreamState(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    DEGRADED = "degraded"
    DISABLED = "disabled"
    CLOSED = "closed"


class Event(enum.Enum):
    CONNECTED = "connected"  # handshake done and the first complete tools/list arrived
    CONNECT_FAILED = "connect_failed"  # spawn, handshake or first list failed or timed out
    LOST = "lost"  # a ready session died: child exit, dropped stream, failed health check
    RETRY = "retry"  # the backoff delay ran out (or an operator forced a retry)
    CLOSE = "close"  # pool shutdown, upstream removed or restarted by reconcile


class Action(enum.Enum):
    PUBLISH_TOOLS = "publish_tools"  # hand the complete tool list to the callback
    WITHDRAW_TOOLS = "withdraw_tools"  # callback(None): tools leave search
    CLOSE_SESSION = "close_session"  # tear the transport down (bounded, shielded)
    SCHEDULE_RETRY = "schedule_retry"  # wait backoff(attempt) then feed RETRY
    CONNECT = "connect"  # open transport + handshake + first list


S, E = UpstreamState, Event

TRANSITIONS: dict[tuple[UpstreamState, Event], UpstreamState] = {
    (S.CONNECTING, E.CONNECTED): S.READY,
    (S.CONNECTING, E.CONNECT_FAILED): S.DEGRADED,
    (S.CONNECTING, E.CLOSE): S.CLOSED,
    (S.READY, E.LOST): S.DEGRADED,
    (S.READY, E.CLOSE): S.CLOSED,
    (S.DEGRADED, E.RETRY): S.CONNECTING,
    (S.DEGRADED, E.CLOSE): S.CLOSED,
    (S.DISABLED, E.CLOSE): S.CLOSED,
}


class InvalidTransition(RuntimeError):
    """An event arrived that the table does not allow in the current state (a bug)."""


@dataclass(frozen=True)
class Decision:
    state: UpstreamState
    actions: tuple[Action, ...]
    # Consecutive failures so far; the next retry waits backoff(attempt).
    attempt: int


def decide(
    state: UpstreamState,
    event: Event,
    *,
    attempt: int,
    healthy_for: float = 0.0,
    reset_after: float = 60.0,
) -> Decision:
    """What to do when ``event`` happens in ``state``.

    ``attempt`` is the count of consecutive failed connections; ``healthy_for`` is how long
    the session that was just lost had been READY. A session that stayed healthy for
    ``reset_after`` seconds resets the count, so a long-lived upstream that drops once
    reconnects fast instead of inheriting an old, long delay.

    Raises InvalidTransition for a pair the table does not list.
    """
    try:
        nxt = TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(f"event {event.value!r} is not allowed in state {state.value!r}") from None
    actions: tuple[Action, ...]
    if event is E.CONNECTED:
        actions, attempt = (Action.PUBLISH_TOOLS,), attempt
    elif event is E.CONNECT_FAILED:
        attempt += 1
        actions = (Action.CLOSE_SESSION, Action.SCHEDULE_RETRY)
    elif event is E.LOST:
        attempt = 1 if healthy_for >= reset_after else attempt + 1
        actions = (Action.WITHDRAW_TOOLS, Action.CLOSE_SESSION, Action.SCHEDULE_RETRY)
    elif event is E.RETRY:
        actions = (Action.CONNECT,)
    else:  # CLOSE
        actions = (Action.WITHDRAW_TOOLS, Action.CLOSE_SESSION) if state is S.READY else (Action.CLOSE_SESSION,)
    return Decision(nxt, actions, attempt)
