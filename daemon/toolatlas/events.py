"""Structured events: one JSON object a line, on stderr by default (journald under systemd).

Each line is `{"ts": RFC 3339 UTC, "event": NAME, "environment": LABEL, ...fields}` (the
daemon's `[daemon] environment`, so lines of a production and a staging daemon sharing a
log pipeline are told apart; left out when no label is set). Names and fields are stable
(a log pipeline keys on them); `EVENT_FIELDS` below is the list of every event the daemon
emits with exactly the fields each carries (a test checks it against a running daemon):

Audit events also carry the audit fields `AUDIT_FIELDS` (who asked, over what, which request):
`principal` (`uid:N`, `token:NAME` or `oauth:ISSUER#SUB`), `user` (the uid's user name, or the
OAuth subject; null for a static token), `client` and `client_version` (the client's
clientInfo), `endpoint` (the [[endpoint]] name; "default" for [daemon] socket and /mcp),
`connection` (the connection's id in this daemon run) and `request` (the JSON-RPC request id).

- `tools_list_served` (audit): `tools`, `passthrough`
- `tool_search_completed` (audit): `query` (only with `log_queries`), `results`,
  `matched_servers`, `latency_ms`, `top_k`, `scope`, `mode`, `cache` ("hit"|"miss")
- `tool_search_fallback`: search degraded (`reason`, `mode`)
- `execute_tool_completed` (audit): `name`, `upstream`, `via` ("execute_tool"|"direct"),
  `outcome` ("ok"|"error": the tool's isError), `latency_ms`
- `execute_tool_failed` (audit): `name`, `upstream`, `via`, `outcome`
  (bad_input|timeout|unavailable|error), `error_class`, `message` (at most 300 characters;
  argument values that fail the inputSchema left out), `latency_ms`
- `access_denied` (audit): `surface` (tool_search|execute_tool|direct|http), `target` (the tool
  or server asked for, null when none), `reason`
- `upstream_state_changed`: `upstream`, `old`, `new`, `reason`
- `catalog_changed`: `server`, `available`, `tools`, `upserted`, `removed`, `quarantined`,
  `card` (the card verdict, null before the first listing)
- `config_reloaded`: `added`, `removed`, `changed` (upstream names)
- `config_reload_rejected`: `reason`
- `admin_command_completed` (audit): an operator command on the socket (`toolatlas upstream
  ...`, `toolatlas reload`): `command` (upstream_list|upstream_restart|upstream_relist|
  upstream_approve|upstream_reject|reload), `upstream` (null for list and reload), `outcome`
  (ok|failed|bad_input|error), `message` (why it failed, else null)
- `admin_command_refused` (audit): a peer that is neither the daemon's user nor root asked for
  one: `command`, `pid`, `reason`
- `upstream_relisted`: an operator's re-list: `upstream`, `tools`, `added`, `removed`, `changed`
  (namespaced tool names)
- `upstream_approval_changed` (to the audit file too): `upstream`, `old` (null: no decision
  before), `new` (pending|approved|rejected), `by` (`daemon` or the operator's principal), `reason`

Audit events go to stderr like every event and, with `[events] audit_file`, to that file too
(`toolatlas.auditlog`).

Privacy: a field named `query` (at any depth) is dropped unless `log_queries=True`, since
queries can carry user data. Every configured secret (see `toolatlas.config.secrets`) is
replaced by `[REDACTED]` wherever it appears, in keys and values, before serialisation: pass
the daemon's `toolatlas.redact.Redactor` (or `secrets=` for one of its own). Writing never
raises: a closed or broken stream loses the line, not the daemon.
"""

from __future__ import annotations

import enum
import math
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import msgspec

from toolatlas.auditlog import AuditSink
from toolatlas.redact import Redactor

TOOLS_LIST_SERVED = "tools_list_served"
TOOL_SEARCH_COMPLETED = "tool_search_completed"
TOOL_SEARCH_FALLBACK = "tool_search_fallback"
EXECUTE_TOOL_COMPLETED = "execute_tool_completed"
EXECUTE_TOOL_FAILED = "execute_tool_failed"
UPSTREAM_STATE_CHANGED = "upstream_state_changed"
CATALOG_CHANGED = "catalog_changed"
CONFIG_RELOADED = "config_reloaded"
CONFIG_RELOAD_REJECTED = "config_reload_rejected"
ADMIN_COMMAND_COMPLETED = "admin_command_completed"
ADMIN_COMMAND_REFUSED = "admin_command_refused"
UPSTREAM_RELISTED = "upstream_relisted"
ACCESS_DENIED = "access_denied"
RESOURCE_READ_COMPLETED = "resource_read_completed"
PROMPT_GET_COMPLETED = "prompt_get_completed"
UPSTREAM_APPROVAL_CHANGED = "upstream_approval_changed"

# Who asked, over what, which request: carried by every audit event.
AUDIT_FIELDS = frozenset({"principal", "user", "client", "client_version", "endpoint", "connection", "request"})

# Every event the daemon emits and exactly its fields (besides "ts" and "event").
EVENT_FIELDS: Mapping[str, frozenset[str]] = {
    TOOLS_LIST_SERVED: AUDIT_FIELDS | {"tools", "passthrough"},
    TOOL_SEARCH_COMPLETED: AUDIT_FIELDS | {
        "query", "results", "matched_servers", "latency_ms", "top_k", "scope", "mode", "cache"},
    TOOL_SEARCH_FALLBACK: frozenset({"reason", "mode"}),
    EXECUTE_TOOL_COMPLETED: AUDIT_FIELDS | {"name", "upstream", "via", "outcome", "latency_ms"},
    EXECUTE_TOOL_FAILED: AUDIT_FIELDS | {
        "name", "upstream", "via", "outcome", "error_class", "message", "latency_ms"},
    ACCESS_DENIED: AUDIT_FIELDS | {"surface", "target", "reason"},
    RESOURCE_READ_COMPLETED: AUDIT_FIELDS | {"uri", "upstream", "outcome"},
    PROMPT_GET_COMPLETED: AUDIT_FIELDS | {"name", "upstream", "outcome"},
    UPSTREAM_STATE_CHANGED: frozenset({"upstream", "old", "new", "reason"}),
    CATALOG_CHANGED: frozenset({"server", "available", "tools", "upserted", "removed", "quarantined", "card"}),
    CONFIG_RELOADED: frozenset({"added", "removed", "changed"}),
    CONFIG_RELOAD_REJECTED: frozenset({"reason"}),
    ADMIN_COMMAND_COMPLETED: AUDIT_FIELDS | {"command", "upstream", "outcome", "message"},
    ADMIN_COMMAND_REFUSED: AUDIT_FIELDS | {"command", "pid", "reason"},
    UPSTREAM_RELISTED: frozenset({"upstream", "tools", "added", "removed", "changed"}),
    UPSTREAM_APPROVAL_CHANGED: frozenset({"upstream", "old", "new", "by", "reason"}),
}
# The events written to the audit file: those carrying the audit fields, and approval changes.
AUDIT_EVENTS = frozenset(name for name, fields in EVENT_FIELDS.items() if AUDIT_FIELDS <= fields) | {
    UPSTREAM_APPROVAL_CHANGED}
EVENT_NAMES = frozenset(EVENT_FIELDS)
MESSAGE_CHARS = 300  # execute_tool_failed's message is cut to this

QUERY_FIELD = "query"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_RESERVED = ("ts", "event", "environment")
_encode = msgspec.json.Encoder().encode


_second: tuple[int, str] = (-1, "")  # the last second formatted (one tuple: swapped whole)


def rfc3339_now() -> str:
    """Current UTC time as RFC 3339 with milliseconds, e.g. 2026-11-29T13:08:10.123Z. The
    seconds are formatted once per second (strftime was a tenth of an event's cost)."""
    global _second
    ms = time.time_ns() // 1_000_000
    sec, text = _second
    if sec != ms // 1000:
        sec, text = _second = (ms // 1000, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)))
    return f"{text}.{ms % 1000:03d}Z"


class Events:
    """Writes structured events as JSON lines.

    `stream=None` writes to whatever `sys.stderr` is at emit time. Safe to call from worker
    threads (one lock around the write, so lines never interleave).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        log_queries: bool = False,
        secrets: Sequence[str] = (),
        redactor: Redactor | None = None,
        audit: AuditSink | None = None,
    ) -> None:
        """`audit`: where audit events go besides `stream` (the audit file)."""
        self._stream = stream
        self.audit = audit
        # A second audit sink beside the file: the shared store's (toolatlas.store.audit), set
        # by its wiring when `[store] url` and `[events] audit_file` are both configured.
        self.shared_audit: AuditSink | None = None
        self.log_queries = log_queries
        self.environment: str | None = None  # the envelope's "environment" (set by the gateway)
        self.redactor = redactor if redactor is not None else Redactor()
        self.redactor.add(secrets)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Events log_queries={self.log_queries} secrets={len(self.redactor)}>"

    def audits(self, event: str) -> bool:
        """Whether `event` goes to an audit trail (the file, the shared store's). A caller that
        answers a request writes such a line before the answer: a daemon killed once the
        answer is out must still have it."""
        return event in AUDIT_EVENTS and (self.audit is not None or self.shared_audit is not None)

    def add_secrets(self, secrets: Sequence[str]) -> None:
        """Redact these too from now on (after a config reload brought new ones). For a
        header-style value "Scheme credential" the credential alone is redacted as well."""
        self.redactor.add(secrets)

    def emit(self, event: str, **fields: Any) -> None:
        """Write one event line. `event` must be a snake_case name (ValueError otherwise).

        Fields named `ts`, `event` or `environment` cannot override the envelope; they are
        written as `field_ts` / `field_event` / `field_environment`. Values that are not JSON types are written as `str(value)`.
        """
        if not _NAME_RE.match(event):
            raise ValueError(f"event name {event!r} is not snake_case")
        record: dict[str, Any] = {"ts": rfc3339_now(), "event": event}
        if self.environment:
            record["environment"] = self.environment
        for key, value in fields.items():
            if key == QUERY_FIELD and not self.log_queries:
                continue
            record[f"field_{key}" if key in _RESERVED else key] = value
        audited = self.audits(event)
        line = None if audited else self._plain_line(record)
        cleaned: dict[str, Any] = record
        if line is None:
            cleaned = self._clean(record)
            line = _encode(cleaned).decode()
        stream = self._stream if self._stream is not None else sys.stderr
        with self._lock:
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):
                # Broken pipe or closed stream: nothing sensible to do but keep serving.
                pass
        if audited:
            if self.audit is not None:
                self.audit.append(cleaned, line)
            if self.shared_audit is not None:
                self.shared_audit.append(cleaned, line)

    def _plain_line(self, record: dict[str, Any]) -> str | None:
        """`record`'s line when nothing in it needs cleaning, else None (`_clean` does it
        value by value): every value a JSON scalar (a finite float) or a list of strings, and
        no secret anywhere in the line (`Redactor.absent_from_json`). Most events are such
        records; this way their strings are not redacted one regex pass each (a cache-hit
        tool_search's event: ~20 of its ~50 us)."""
        for value in record.values():
            kind = type(value)
            if kind is str or kind is int or kind is bool or value is None:
                continue
            if kind is float:
                if not math.isfinite(value):
                    return None
                continue
            if (kind is list or kind is tuple) and all(type(v) is str for v in value):
                continue
            return None
        line: str = _encode(record).decode()
        return line if self.redactor.absent_from_json(line) else None

    def _clean(self, value: Any) -> Any:
        kind = type(value)
        if kind is str:
            return self.redactor(value)
        if kind is int or kind is bool or value is None:
            return value
        if isinstance(value, str):
            return self.redactor(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)  # NaN is not JSON
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, enum.Enum):
            return self._clean(value.value)
        if isinstance(value, Mapping):
            return {
                self.redactor(str(k)): self._clean(v)
                for k, v in value.items()
                if self.log_queries or k != QUERY_FIELD
            }
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self._clean(v) for v in value]
        if isinstance(value, BaseException):
            return self.redactor(f"{type(value).__name__}: {value}")
        return self.redactor(str(value))
