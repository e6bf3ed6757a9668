"""A tool call as one value through every layer (surface -> gateway -> pool -> session).

`CallRequest` is what a client asked for, by its namespaced name; the gateway checks it
(access, arguments, sealed input state) and routes it as an `UpstreamCall` to the owning
upstream's warm session; the pool answers with an `UpstreamReply`, which the gateway hands
back as a `CallOutcome`. The SDK's own result object travels inside as an opaque payload:
only `upstream/` and `surface/` know MCP types.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

# (progress, total, message) -> None, awaited for each upstream progress notification.
ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
# Asks the caller's user what an upstream's `elicitation/create` asks (its params, wire form)
# and returns the answer (an ElicitResult, wire form); raises RelayRefused when it cannot.
ElicitFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
# (server, params) -> None: an upstream log message (`notifications/message` params, wire
# form) for the caller of a call in flight.
LogFn = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A client's tools/call or execute_tool, as the surface received it.

    `arguments` is unchecked client input (an object, a JSON string, or anything else: the
    gateway says what is wrong). `allow_input_required` is set for 2026-07-28 callers, who
    can answer an `input_required` result; their retry carries `input_responses` and the
    gateway-sealed `request_state`.
    """

    name: str
    arguments: object = None
    progress: ProgressFn | None = None
    allow_input_required: bool = False
    input_responses: Mapping[str, Any] | None = None
    request_state: str | None = None
    # How an upstream's question during the call reaches the user. None from a 2026-07-28
    # caller that can answer questions: the gateway turns them into input_required rounds.
    elicit: ElicitFn | None = None
    # A caller's log opt-in: messages at `log_level` and above go to `log`. A 2026-07-28
    # caller's is per request; a 2025-era caller's is its logging/setLevel level, and then
    # `log_scoped_only`: a 2025-era upstream's messages reach it by the connection already.
    log: LogFn | None = None
    log_level: str | None = None
    log_scoped_only: bool = False
    # The surface's raw relay asks for the upstream's wire-form result (a dict) as the
    # payload, where the upstream's transport allows it; it may still get a CallToolResult.
    raw: bool = False


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """A checked call routed to one upstream: its own tool name, validated arguments and
    the upstream's own (unsealed) request state."""

    server: str
    tool: str
    arguments: dict[str, Any] | None
    progress: ProgressFn | None = None
    allow_input_required: bool = False
    input_responses: Mapping[str, Any] | None = None
    request_state: str | None = None
    timeout: float | None = None  # None: the upstream's timeouts.call
    elicit: ElicitFn | None = None
    log: LogFn | None = None
    log_level: str | None = None
    log_scoped_only: bool = False  # see CallRequest.log_scoped_only
    raw: bool = False  # see CallRequest.raw


@dataclass(frozen=True, slots=True)
class InputRequired:
    """An upstream's 2026-07-28 `input_required` answer: its requests (the SDK's objects,
    passed through) and the opaque state the retry must carry."""

    input_requests: object
    request_state: str | None


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """What the upstream answered: either a complete result (`payload`, the SDK's
    CallToolResult, or for a raw call its wire-form dict, passed through untouched) or an
    `input_required`."""

    payload: object = None
    is_error: bool = False
    input_required: InputRequired | None = None
    # URIs of the resource links and embedded resources in the result: a client may read
    # them through the gateway, which routes the read to this upstream.
    resource_uris: tuple[str, ...] = ()
    # A raw call's payload already in the SDK server's wire form for this protocol version
    # (its per-version result surface): a caller on that version needs no second pass.
    wire_version: str | None = None


# The gateway hands an UpstreamReply back to the surface with the request state sealed.
CallOutcome = UpstreamReply

__all__ = ["CallOutcome", "CallRequest", "ElicitFn", "InputRequired", "LogFn", "ProgressFn", "UpstreamCall", "UpstreamReply"]
