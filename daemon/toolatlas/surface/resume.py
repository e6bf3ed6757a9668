"""What `toolatlas shim` remembers of its client's MCP session, so a new daemon connection can
take it over: pure bookkeeping, no I/O (the relay loop in surface.shim does the I/O).

Each method takes one event (a line from the client, a line from the daemon, a connection
made or lost) and returns the lines to write to the daemon and to the client:

- A legacy (<= 2025-11-25) session is replayed on a new connection by its `initialize`
  (under a shim-chosen id whose answer is swallowed) and `notifications/initialized`; a
  2026-07-28 session by its `server/discover` (swallowed too: the daemon wants a first message).
- Open `subscriptions/listen` streams are re-sent with their own ids; the new daemon's
  acknowledgement is swallowed, so the client's stream simply goes on.
- Once back, the client hears `notifications/tools/list_changed`: as a session notification
  (legacy) and on each listen stream that asked for tool changes, tagged with its
  subscription id as the daemon tags them. The daemon may have changed (a new config or
  version): the client refetches rather than trust a list from before.
- Requests in flight when the connection drops get a JSON-RPC error each; requests sent
  while there is no daemon get one at once, saying it is starting or restarting.

Stdlib only: the shim must start in a few tens of milliseconds.
"""

from __future__ import annotations

import enum
import itertools
import json
from typing import Any, NamedTuple

from toolatlas.jsonlines import Refusal, is_request_id

# -32000..-32099: implementation-defined server errors (the daemon's socket caps use -32000 too).
UNAVAILABLE = -32000
HANDSHAKES = frozenset({"initialize", "server/discover"})
LISTEN = "subscriptions/listen"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
TOOLS_CHANGED = "notifications/tools/list_changed"
REPLAY_ID_PREFIX = "toolatlas-shim-replay-"

# What the daemon writes (the SDK's model_dump_json, the fast lane's msgspec) is compact JSON
# with "jsonrpc" first and then "id" or "method": read kind and id off the start of a line
# without decoding a result that may be megabytes long. Anything else is decoded.
_ID_FIRST = b'{"jsonrpc":"2.0","id":'
_METHOD_FIRST = b'{"jsonrpc":"2.0","method":"'
_KINDS = {b"result": "response", b"error\"": "response", b"method": "request"}

Id = str | int


class Link(enum.Enum):
    STARTING = "starting"  # no daemon connection yet (`shim --config` is starting one)
    UP = "up"
    DOWN = "down"  # the connection was lost; reconnecting


class Out(NamedTuple):
    """Lines (each ending in a newline) to write: to the daemon, to the client."""

    daemon: list[bytes]
    client: list[bytes]


class DaemonLine(NamedTuple):
    kind: str  # "response", "request" (the daemon asks the client), "notification", "other"
    id: Any
    method: str | None = None
    ok: bool = False  # a response with a result (not an error)


def read_daemon_line(line: bytes) -> DaemonLine:
    """The kind, id and method of a line from the daemon; off its start when it can."""
    if line.startswith(_ID_FIRST):
        # The id ends at the comma that opens the next key: a quote inside a JSON string is
        # escaped, so `,"` cannot occur within an id.
        end = line.find(b',"', len(_ID_FIRST))
        kind = _KINDS.get(line[end + 2:end + 8]) if end > 0 else None
        if kind is not None:
            try:
                id_ = json.loads(line[len(_ID_FIRST):end])
            except ValueError:
                pass
            else:
                return DaemonLine(kind, id_, ok=line[end + 2:end + 8] == b"result")
    elif line.startswith(_METHOD_FIRST):
        end = line.find(b'"', len(_METHOD_FIRST))
        return DaemonLine("notification", None, line[len(_METHOD_FIRST):end].decode(errors="replace"))
    try:
        msg = json.loads(line)
    except ValueError:
        return DaemonLine("other", None)
    if not isinstance(msg, dict):
        return DaemonLine("other", None)
    method = msg.get("method") if isinstance(msg.get("method"), str) else None
    if method is not None:
        return DaemonLine("request" if "id" in msg else "notification", msg.get("id"), method)
    return DaemonLine("response" if "id" in msg else "other", msg.get("id"), ok="result" in msg)


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _with_id(line: bytes, new_id: Id) -> bytes:
    msg = json.loads(line)
    msg["id"] = new_id
    return _line(msg)


class Session:
    """The client's session as the shim has seen it (see the module docstring)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.link = Link.STARTING
        self.down_reason = ""  # appended to the "starting/restarting" error (e.g. the daemon exited)
        self.handshake: bytes | None = None  # the client's initialize or server/discover, once answered
        self.initialized: bytes | None = None
        self.listens: dict[Id, tuple[bytes, bool]] = {}  # open listen id -> (its line, wants tool changes)
        # request id -> its method, once per request in flight on the current connection (a
        # client may reuse an id before its answer: each is answered, and owed, on its own)
        self.pending: dict[Id, list[str]] = {}
        self.held: list[bytes] = []  # the handshake, while the first connection is being made
        self._asking: tuple[Id, bytes] | None = None  # the client's handshake request, until answered
        self._replays: set[Id] = set()  # ids of replayed requests whose answers are swallowed
        self._reacks: set[Id] = set()  # listens re-sent, whose new acknowledgement is swallowed
        self._asked: set[Id] = set()  # the daemon's requests to the client on this connection
        self._stale: set[Id] = set()  # the same from lost connections: answers to those are dropped
        self._seq = itertools.count(1)

    def __repr__(self) -> str:
        return (f"<Session {self.link.value} pending={len(self.pending)} listens={len(self.listens)} "
                f"legacy={self.initialized is not None}>")

    @property
    def resumable(self) -> bool:
        """Whether a new connection has something to replay (else it waits for a request)."""
        return self.handshake is not None or bool(self.listens)

    # -- the client's lines ----------------------------------------------------------------

    def from_client(self, line: bytes) -> Out:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):  # not JSON, a batch: the daemon says what is wrong with it
            return Out([line + b"\n"], []) if self.link is Link.UP else Out([], [self.refusal(None)])
        method, id_ = msg.get("method"), msg.get("id")
        if not isinstance(method, str):
            return self._client_response(line, id_)
        if "id" not in msg:
            return self._client_notification(line, method, msg.get("params"))
        if self.link is Link.UP:
            return Out([self._track(line, method, id_, msg.get("params"))], [])
        if self.link is Link.STARTING and method in HANDSHAKES and not self.held:
            self.held.append(line + b"\n")  # sent once the daemon answers (bounded by the shim)
            return Out([], [])
        return Out([], [self.refusal(id_)])

    def _track(self, line: bytes, method: str, id_: Any, params: Any) -> bytes:
        if is_request_id(id_):
            self.pending.setdefault(id_, []).append(method)
            if method in HANDSHAKES and self.handshake is None:
                self._asking = (id_, line + b"\n")
            elif method == LISTEN:
                notes = params.get("notifications") if isinstance(params, dict) else None
                self.listens[id_] = (line, isinstance(notes, dict) and notes.get("toolsListChanged") is True)
        return line + b"\n"

    def settle(self, id_: Id) -> None:
        """One request with this id is answered (or cancelled): it is no longer owed."""
        methods = self.pending.get(id_)
        if methods is not None:
            methods.pop(0)
            if not methods:
                del self.pending[id_]

    def _client_notification(self, line: bytes, method: str, params: Any) -> Out:
        if method == "notifications/initialized":
            self.initialized = line + b"\n"
        elif method == "notifications/cancelled" and isinstance(params, dict):
            rid = params.get("requestId")
            if isinstance(rid, (str, int)):
                self.settle(rid)
                self.listens.pop(rid, None)  # how a client closes its listen stream
        if self.link is Link.UP:
            return Out([line + b"\n"], [])
        if self.link is Link.STARTING and self.held:
            self.held.append(line + b"\n")
        return Out([], [])

    def _client_response(self, line: bytes, id_: Any) -> Out:
        """The client answers a request of the daemon's (elicitation, sampling, roots)."""
        if is_request_id(id_) and id_ in self._stale:
            self._stale.discard(id_)  # asked by a daemon that is gone: the new one never asked
            return Out([], [])
        if self.link is not Link.UP:
            return Out([], [])
        if is_request_id(id_):
            self._asked.discard(id_)
        return Out([line + b"\n"], [])

    def refusal(self, id_: Any) -> bytes:
        """The error for a request that arrives while no daemon answers."""
        state = "starting" if self.link is Link.STARTING else "restarting"
        why = f"; {self.down_reason}" if self.down_reason else ""
        message = (f"the toolatlas daemon is {state} (its socket {self.socket_path} does not answer yet){why}; "
                   "this request was not run: retry in a few seconds")
        return Refusal(UNAVAILABLE, message, id_ if is_request_id(id_) else None).line()

    # -- the daemon's lines -----------------------------------------------------------------

    def from_daemon(self, line: bytes) -> Out:
        """What to pass to the client (`Out.daemon` is always empty here)."""
        kind, id_, method, ok = read_daemon_line(line)
        if kind == "response" and is_request_id(id_):
            if id_ in self._replays:
                self._replays.discard(id_)
                return Out([], [])
            self.settle(id_)
            self.listens.pop(id_, None)  # a listen's result ends its stream
            if self._asking is not None and self._asking[0] == id_:
                if ok:  # a session worth resuming
                    self.handshake = self._asking[1]
                self._asking = None
        elif kind == "request" and is_request_id(id_):
            self._asked.add(id_)
        elif kind == "notification" and method == ACKNOWLEDGED and self._reacks:
            sid = self._subscription_id(line)
            if sid in self._reacks:
                self._reacks.discard(sid)
                return Out([], [])
        return Out([], [line + b"\n"])

    @staticmethod
    def _subscription_id(line: bytes) -> Any:
        try:
            meta = json.loads(line)["params"]["_meta"]
        except (ValueError, KeyError, TypeError):
            return None
        return meta.get(SUBSCRIPTION_ID) if isinstance(meta, dict) else None

    # -- the connection ---------------------------------------------------------------------

    def connected(self) -> Out:
        """A connection to the daemon is made: replay the session on it, then tell the
        client to refetch its tools. The first connection only sends what was held."""
        first = self.link is Link.STARTING
        self.link = Link.UP
        self.down_reason = ""
        if first:
            held, self.held = self.held, []
            return Out([self._resend(line) for line in held], [])
        to_daemon: list[bytes] = []
        to_client: list[bytes] = []
        if self.handshake is not None:
            replay_id = f"{REPLAY_ID_PREFIX}{next(self._seq)}"
            self._replays.add(replay_id)
            to_daemon.append(_with_id(self.handshake, replay_id))
            if self.initialized is not None:
                to_daemon.append(self.initialized)
                to_client.append(_line({"jsonrpc": "2.0", "method": TOOLS_CHANGED}))
        for id_, (line, tools) in self.listens.items():
            self._reacks.add(id_)
            self.pending[id_] = [LISTEN]
            to_daemon.append(line + b"\n")
            if tools:
                to_client.append(_line({"jsonrpc": "2.0", "method": TOOLS_CHANGED,
                                        "params": {"_meta": {SUBSCRIPTION_ID: id_}}}))
        return Out(to_daemon, to_client)

    def _resend(self, line: bytes) -> bytes:
        msg = json.loads(line)
        if isinstance(msg, dict) and isinstance(msg.get("method"), str) and "id" in msg:
            return self._track(line.rstrip(b"\n"), msg["method"], msg["id"], msg.get("params"))
        return line

    def lost(self, cause: str) -> Out:
        """The connection is gone: every request in flight on it gets an error (`cause` says
        why); listen streams stay open, to be re-sent on the next connection."""
        self.link = Link.DOWN
        errors = []
        for id_, methods in self.pending.items():
            if id_ in self.listens:
                continue
            errors += [Refusal(UNAVAILABLE, (
                f"the connection to the toolatlas daemon was lost while this {method} was in flight ({cause}); "
                "it may or may not have run. The shim is reconnecting: retry in a few seconds"), id_).line()
                for method in methods]
        self.pending.clear()
        self._asking = None
        self._replays.clear()
        self._reacks.clear()
        self._stale |= self._asked
        self._asked.clear()
        return Out([], errors)

    def expire_held(self) -> Out:
        """The first connection took too long: answer the held handshake with the error."""
        out = [self.refusal(json.loads(line).get("id")) for line in self.held if b'"id"' in line]
        self.held = []
        return Out([], out)
