"""The SDK client of one upstream, made in one place, and what its failures mean, decided once.

`make_client` builds the `mcp.Client` every path uses (the owner task and the one-shot
`list_tools_once`). `classify` turns an exception into a `LossReason` by its type alone:
whether the session is gone (reconnect) or only this request failed. `call_error` maps a
failed call onto the toolatlas error tree. `describe` is the one-line text logs and status
show. Nothing here looks at an error message to decide anything.
"""

from __future__ import annotations

import enum
import urllib.parse
from dataclasses import dataclass
from typing import Literal

import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp.client import Transport
from mcp.client.session import ClientRequestContext, ElicitationFnT, MessageHandlerFnT
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from toolatlas.calls import ProgressFn
from toolatlas.config import Upstream
from toolatlas.errors import ToolatlasError, UpstreamProtocolError, UpstreamTimeout, UpstreamUnavailable
from toolatlas.upstream.children import SpawnError
from toolatlas.upstream.outputs import harden

_CLIENT_INFO = mcp_types.Implementation(name="toolatlas", version="0.1.0")
# Seconds a teardown may take (stdio escalation is bounded below this on its own).
CLOSE_TIMEOUT = 10.0


class LossReason(enum.Enum):
    """Why a session ended, or why one request on it failed.

    `session_gone` says which of them mean "reconnect": the owner task tears the session
    down for those and keeps it for the others (a call's JSON-RPC error or timeout).
    """

    EOF = "eof"  # the peer closed the connection: read stream ended, "Connection closed"
    TRANSPORT = "transport"  # connection-level failure: refused, reset, broken stream
    SESSION_EXPIRED = "session_expired"  # HTTP 404 on a 2025-era session id the server forgot
    HEALTH_CHECK = "health_check"  # ping / server/discover failed or did not answer
    LISTEN = "listen"  # the subscriptions/listen stream could not be kept open
    TIMEOUT = "timeout"  # a bounded step (connect, tools/list, a call) ran out of time
    PROTOCOL = "protocol"  # the upstream answered, but wrongly (JSON-RPC error, invalid result)

    @property
    def session_gone(self) -> bool:
        """True when the failure means the session itself is dead, not just one request."""
        return self in _GONE


_GONE = frozenset({LossReason.EOF, LossReason.TRANSPORT, LossReason.SESSION_EXPIRED})


@dataclass(frozen=True)
class Loss:
    """A session's end: the typed reason the code acts on, the text status shows."""

    reason: LossReason
    text: str


@dataclass
class Phase:
    """Which bounded step of a connection runs now, for the timeout message; of a paged
    listing, how far it got (`paged`)."""

    name: str
    seconds: float
    pages: int = 0
    items: int = 0

    def paged(self, pages: int, items: int) -> None:
        self.pages, self.items = pages, items


def phase_timeout(upstream: str, phase: Phase, said: str | None = None) -> Loss:
    """The loss of a step that ran out of time; a listing still paging then says so (the
    upstream answered page after page: "did not answer" would send the operator the wrong way).
    `said`: a stdio child's last words meanwhile (`timeout_loss`)."""
    if not phase.pages:
        return timeout_loss(upstream, phase.name, phase.seconds, said)
    return Loss(LossReason.TIMEOUT, f"upstream {upstream!r} was still paging {phase.name} when its {phase.seconds:g} s "
                f"ran out: {phase.pages} pages ({phase.items} items) answered, each with a next cursor; does its "
                "listing end?")


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def classify(exc: BaseException, *, live: bool = False) -> LossReason:
    """The `LossReason` an exception raised by the SDK or a transport stands for, by type.

    A JSON-RPC error is the upstream answering (PROTOCOL), except CONNECTION_CLOSED, which
    the SDK synthesises when the connection ends under a pending request (EOF). Anything
    unknown counts as PROTOCOL: the request failed, the session is not presumed dead.

    CONNECTION_CLOSED is -32000, the first code of JSON-RPC's server-error range, which
    upstreams use for errors of their own: `live` (the caller knows the connection's read
    stream has not ended) makes such an error the upstream's answer (PROTOCOL). A connection
    that really ended reports it before the SDK fails the requests it left pending.
    """
    exc = _innermost(exc)
    if isinstance(exc, TimeoutError):  # before OSError, of which it is a subclass
        return LossReason.TIMEOUT
    if isinstance(exc, MCPError):
        closed = exc.error.code == mcp_types.CONNECTION_CLOSED and not live
        return LossReason.EOF if closed else LossReason.PROTOCOL
    if isinstance(exc, (EOFError, anyio.EndOfStream)):
        return LossReason.EOF
    if isinstance(exc, (httpx2.TransportError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)):
        return LossReason.TRANSPORT
    return LossReason.PROTOCOL


def describe(exc: BaseException) -> str:
    """A one-line reason for logs and status: the innermost meaningful error."""
    exc = _innermost(exc)
    if isinstance(exc, SpawnError):  # a sentence already
        return str(exc)
    if isinstance(exc, MCPError):
        return f"JSON-RPC error {exc.error.code}: {exc.error.message}"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from {exc.request.url}"
    if isinstance(exc, ValidationError) and (errors := exc.errors()):
        # Its first line is only a count ("1 validation error for CallToolResult"): say where.
        where = ".".join(str(part) for part in errors[0]["loc"]) or "the whole value"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"ValidationError: {exc.title}: {where}: {errors[0]['msg']}{more}"
    text = str(exc).strip().splitlines()
    if isinstance(exc, httpx2.TransportError):  # which endpoint, and for a bare timeout what it waited for
        said = text[0][:300] if text else _WAITED.get(type(exc).__name__, "no answer")
        return f"{type(exc).__name__}: {said}{_at(exc)}"
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


# What an httpx timeout without a message waited for.
_WAITED = {"ConnectTimeout": "no connection was made in time", "ReadTimeout": "no data came in time",
           "WriteTimeout": "the request could not be sent in time",
           "PoolTimeout": "no free connection to the upstream in time"}


def _at(exc: httpx2.TransportError) -> str:
    """" (at URL)" of the request `exc` failed, without userinfo or query; "" when unknown."""
    try:
        return f" (at {shown_url(str(exc.request.url))})"
    except RuntimeError:  # raised outside a request
        return ""


# The `data` of the JSON-RPC error answering a request the server refused because it no longer
# knew the session (streamable HTTP's 404 on a session id: it did not run the request).
FORGOTTEN = {"dev.toolatlas/session": "forgotten"}


def session_forgotten(exc: BaseException) -> bool:
    """Whether `exc` is that error (answers.py makes it): the request can be made again."""
    inner = _innermost(exc)
    return isinstance(inner, MCPError) and inner.error.data == FORGOTTEN


# HTTP statuses that mean "who you are was not accepted": said as such, naming the headers.
AUTH_STATUSES = frozenset({401, 403})


def shown_url(url: str) -> str:
    """`url` as logs and errors show it: without userinfo, query or fragment."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def auth_failure(up: Upstream, status: int, url: str) -> str:
    """What an HTTP 401/403 from `up` means, naming the headers sent (never their values) or
    saying none are configured. `url` is shown without userinfo or query."""
    where = shown_url(url)
    headers = sorted(getattr(up, "headers", None) or {})
    if headers:
        names = " and ".join(repr(h) for h in headers)
        hint = f"check the {names} header{'s' if len(headers) > 1 else ''} set in [[upstream]] {up.name!r} headers"
    else:
        hint = (f"no headers are configured in [[upstream]] {up.name!r}; set the one the server expects, "
                'e.g. headers = { Authorization = "Bearer ${TOKEN}" }')
    if urllib.parse.urlsplit(getattr(up, "url", "")).password is not None:
        hint += ", and the password in its url"
    return f"authentication failed (HTTP {status}) at {where}; {hint}"


class AuthWatch:
    """The HTTP authentication refusal (401/403) an upstream's last response was, if any.

    The streamable-HTTP client turns such a response into a bare JSON-RPC error ("Server
    returned an error response"); the transport's response hook reports every status here
    first, so `describe` can say what really happened. An SSE connect raises HTTPStatusError,
    which carries its status itself."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._refused: tuple[int, str] | None = None

    def response(self, status: int, url: str) -> None:
        self._refused = (status, url) if status in AUTH_STATUSES else None

    def failure(self, exc: BaseException) -> str | None:
        """The authentication failure `exc` stands for, or None when it is something else."""
        inner = _innermost(exc)
        if isinstance(inner, httpx2.HTTPStatusError) and inner.response.status_code in AUTH_STATUSES:
            return auth_failure(self.upstream, inner.response.status_code, str(inner.request.url))
        if self._refused is not None and isinstance(inner, MCPError) and inner.error.code == mcp_types.INTERNAL_ERROR:
            return auth_failure(self.upstream, *self._refused)
        return None

    def describe(self, exc: BaseException) -> str:
        """`describe(exc)`, unless it is an authentication failure: then that, said plainly."""
        return self.failure(exc) or describe(exc)


# The `data` of a JSON-RPC error toolatlas put in place of an upstream's reply (upstream.bounded:
# a result over a limit, a reply that is not JSON-RPC, a connection cut mid-reply).
STAND_IN = {"madeBy": "toolatlas"}


def call_error(upstream: str, op: str, exc: Exception, reason: LossReason) -> ToolatlasError:
    """The toolatlas error for request `op` on `upstream` failing with `exc` (classified as
    `reason`, which the caller may have refined, e.g. to SESSION_EXPIRED)."""
    if reason.session_gone:
        return UpstreamUnavailable(f"upstream {upstream!r} lost its session during {op}: {describe(exc)}")
    inner = _innermost(exc)
    if isinstance(inner, MCPError) and inner.error.data == STAND_IN:  # not the upstream's words: do not say it answered so
        return UpstreamProtocolError(f"{op} on upstream {upstream!r} failed: {inner.error.message}", code=inner.error.code)
    if isinstance(inner, MCPError):
        return UpstreamProtocolError(
            f"upstream {upstream!r} answered {op} with JSON-RPC error {inner.error.code}: {inner.error.message}",
            code=inner.error.code,
        )
    if isinstance(inner, ValidationError):
        return UpstreamProtocolError(f"upstream {upstream!r} sent an invalid result for {op}: {describe(exc)}")
    return UpstreamProtocolError(f"upstream {upstream!r} failed {op}: {describe(exc)}")


def timeout_loss(upstream: str, op: str, seconds: float, said: str | None = None) -> Loss:
    """A request that timed out as a loss. `said`, for a stdio child: its last words meanwhile
    ("" when none); a child that did not answer connect in time is told the key to raise."""
    text = str(UpstreamTimeout(upstream, op, seconds)) + (f" ({said})" if said else "")
    if op == "connect" and said is not None:  # npx installing its package, a slow interpreter
        text += "; a server that takes longer to start needs a larger timeouts.connect"
    return Loss(LossReason.TIMEOUT, text)


async def _no_caller(
    context: ClientRequestContext, params: mcp_types.ElicitRequestParams
) -> mcp_types.ElicitResult | mcp_types.ErrorData:
    """A one-shot listing has no caller to ask."""
    return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message="toolatlas is only listing tools; no user to ask")


ConnectMode = Literal["legacy", "auto"] | str


class _Client(Client):
    """The SDK client whose session checks results against output schemas safely (outputs.py)."""

    async def __aenter__(self) -> _Client:
        await super().__aenter__()
        harden(self.session)
        return self


def make_client(
    transport: Transport, *, mode: ConnectMode, message_handler: MessageHandlerFnT | None = None,
    elicitation_callback: ElicitationFnT | None = None,
) -> Client:
    """The SDK client over an unentered `transport`; enter and exit it in one task."""
    # The elicitation callback declares the capability (upstreams check it before asking);
    # the session's `Inbound.elicit` relays each question to the caller that asked it.
    return _Client(
        transport,
        mode=mode,
        message_handler=message_handler,
        client_info=_CLIENT_INFO,
        elicitation_callback=elicitation_callback or _no_caller,
    )


def begin_teardown(scope: anyio.CancelScope) -> bool:
    """Shield the client's teardown in `scope` from outer cancellation and bound it by
    CLOSE_TIMEOUT, unless the scope's own deadline already fired. Returns whether it had."""
    fired = scope.cancel_called
    scope.shield = True
    if not fired:
        scope.deadline = anyio.current_time() + CLOSE_TIMEOUT
    return fired


# Progress notifications of one call waiting for its caller; past this only the newest is
# kept. The SDK runs each notification's callback in a task of its own, and the raw relay
# queued each one: 300,000 from an upstream while the caller was not reading held 2.8 GB
# (SDK) or 95 MB (relay).
MAX_PROGRESS_QUEUED = 64


def progress_fn(fn: ProgressFn | None) -> ProgressFnT | None:
    """`fn` in the SDK's callback shape (its protocol names the parameters), with at most
    MAX_PROGRESS_QUEUED notifications waiting for it: past that each new one replaces the
    last skipped one, which the last waiting callback passes on once the others are through
    (unless a newer one found room meanwhile), so the caller gets them in order, the newest last."""
    if fn is None:
        return None
    callback = fn
    waiting = 0
    newest: tuple[float, float | None, str | None] | None = None

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        nonlocal waiting, newest
        if waiting >= MAX_PROGRESS_QUEUED:
            newest = (progress, total, message)
            return
        newest = None  # older than this one, which goes out after the ones waiting
        waiting += 1
        try:
            await callback(progress, total, message)
            while newest is not None and waiting == 1:
                args, newest = newest, None
                await callback(*args)
        finally:
            waiting -= 1

    return on_progress


__all__ = [
    "AUTH_STATUSES", "AuthWatch", "CLOSE_TIMEOUT", "Loss", "auth_failure", "LossReason", "begin_teardown", "call_error", "classify", "describe",
    "FORGOTTEN", "MAX_PROGRESS_QUEUED", "make_client", "Phase", "phase_timeout", "progress_fn", "session_forgotten", "shown_url",
    "timeout_loss",
]
