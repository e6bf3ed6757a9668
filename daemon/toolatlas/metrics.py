"""Prometheus metrics: one object over an injected `CollectorRegistry`, served on the event loop.

Events are recorded through `Metrics.observe_*` / `count_*`; state that already lives in the
daemon (upstream states, tool counts, index size and version, clients, quarantine) is never
mirrored into gauges by hand but read at scrape time from a `StateSnapshot` callback, so it
cannot drift.

Label values are bounded: upstream names come from the config, modes, outcomes and fallback
kinds from fixed sets, error types from exception class names. Tool names and query text
never become labels. Values that do not look like a short identifier are rejected with
`ValueError` (a programming error, caught by the tests of the caller).

`serve()` answers `GET /metrics` from an anyio TCP listener inside the caller's task group:
no thread, nothing outlives shutdown.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import SocketStream, TaskStatus
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from toolatlas import __version__
from toolatlas.errors import ToolatlasError

logger = logging.getLogger(__name__)

NAMESPACE = "toolatlas"

# Searches are in-process (cache, BM25, HNSW, maybe one embedding): sub-millisecond to ~100 ms.
SEARCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Upstream work spans a warm local call (~2 ms) up to the default 60 s call timeout.
CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RESULT_BUCKETS = (0, 1, 2, 3, 5, 10, 20)

EXECUTE_OUTCOMES = frozenset({"ok", "error", "timeout", "unavailable", "denied", "bad_input"})
FALLBACK_KINDS = frozenset({"bm25-only", "passthrough"})
# A call of a tool that a search on the same connection returned: recorded as a usage event,
# or not (the call failed, or came after the learning window).
FEEDBACK_OUTCOMES = frozenset({"recorded", "call_failed", "outside_window", "dropped"})
# Operator commands on the socket (surface.admin) and how each ended.
ADMIN_COMMANDS = frozenset({"upstream_list", "upstream_restart", "upstream_relist", "upstream_approve", "upstream_reject",
                            "reload", "unknown"})
APPROVAL_STATES = ("pending", "active", "degraded", "inactive", "rejected")
ADMIN_OUTCOMES = frozenset({"ok", "failed", "bad_input", "refused", "error"})
# States exported with value 0 even before an upstream has been in them, so a
# `toolatlas_upstream_state{state="ready"} == 0` alert works from the first scrape.
# States seen at run time are added to this set. Mirrors toolatlas.upstream.state.UpstreamState
# (not imported: this module must not depend on the upstream package).
DEFAULT_UPSTREAM_STATES = ("connecting", "ready", "degraded", "disabled", "closed")

_LABEL_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")

# A request head larger than this, or slower than this, is dropped.
_MAX_REQUEST_HEAD = 16 * 1024
_REQUEST_TIMEOUT = 10.0


class MetricsBindError(ToolatlasError):
    """The metrics listener could not bind its address."""


@dataclass(frozen=True)
class StateSnapshot:
    """What the daemon looks like right now; read once per scrape."""

    upstreams: list[tuple[str, str, int]] = field(default_factory=list)  # (name, state, tools)
    index_size: int = 0
    index_version: int = 0
    clients: int = 0
    quarantined: int = 0
    approvals: list[tuple[str, str]] = field(default_factory=list)  # (upstream, approval lifecycle state)
    endpoints: list[tuple[str, int, int]] = field(default_factory=list)  # (endpoint, clients, tools served)


_CHECKED_LABELS: set[str] = set()  # values that passed _LABEL_RE (a search checks three)


def _label(kind: str, value: str) -> str:
    if value in _CHECKED_LABELS:
        return value
    if not _LABEL_RE.match(value):
        raise ValueError(f"{kind} label value {value!r} is not a short identifier")
    if len(_CHECKED_LABELS) < 4096:
        _CHECKED_LABELS.add(value)
    return value


class _StateCollector:
    """Computes the state gauges from the snapshot callback at scrape time."""

    def __init__(self, states: Sequence[str]) -> None:
        self.source: Callable[[], StateSnapshot] | None = None
        self.known_states: list[str] = list(dict.fromkeys(states))

    def describe(self) -> Iterable[Metric]:
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        snap: StateSnapshot | None = None
        if self.source is not None:
            try:
                snap = self.source()
            except Exception:
                # A broken callback must not fail the whole scrape; counters still export.
                logger.exception("metrics state source failed; state gauges omitted")
                return self._families(None, info_only=True)
        return self._families(snap)

    def _families(self, snap: StateSnapshot | None, *, info_only: bool = False) -> list[Metric]:
        info = GaugeMetricFamily(
            f"{NAMESPACE}_build_info", "toolatlas version (always 1).", labels=["version"]
        )
        info.add_metric([__version__], 1)
        if info_only:
            return [info]
        state = GaugeMetricFamily(
            f"{NAMESPACE}_upstream_state",
            "1 for the current connection state of each upstream, 0 for the others.",
            labels=["upstream", "state"],
        )
        tools = GaugeMetricFamily(
            f"{NAMESPACE}_upstream_tools", "Tools each upstream currently lists.", labels=["upstream"]
        )
        size = GaugeMetricFamily(f"{NAMESPACE}_index_tools", "Tools in the live search index.")
        version = GaugeMetricFamily(
            f"{NAMESPACE}_index_version", "Version of the live search index (bumps on every swap)."
        )
        clients = GaugeMetricFamily(f"{NAMESPACE}_connected_clients", "MCP clients connected now.")
        quarantined = GaugeMetricFamily(
            f"{NAMESPACE}_quarantined_tools", "Tools withheld from search and execution."
        )
        approval = GaugeMetricFamily(
            f"{NAMESPACE}_upstream_approval",
            "1 for the approval lifecycle state of each upstream (pending, active, degraded, inactive, rejected).",
            labels=["upstream", "state"],
        )
        ep_clients = GaugeMetricFamily(f"{NAMESPACE}_endpoint_clients", "Clients connected now, per endpoint.",
                                       labels=["endpoint"])
        ep_tools = GaugeMetricFamily(f"{NAMESPACE}_endpoint_tools", "Tools each endpoint serves now.",
                                     labels=["endpoint"])
        if snap is not None:
            # Accept an enum member as well as its value.
            ups = [(name, str(getattr(st, "value", st)), count) for name, st, count in snap.upstreams]
            for _, current, _ in ups:
                if current not in self.known_states and _LABEL_RE.match(current):
                    self.known_states.append(current)
            for name, current, count in ups:
                for s in self.known_states:
                    state.add_metric([name, s], 1.0 if s == current else 0.0)
                tools.add_metric([name], count)
            size.add_metric([], snap.index_size)
            version.add_metric([], snap.index_version)
            clients.add_metric([], snap.clients)
            quarantined.add_metric([], snap.quarantined)
            for name, current in snap.approvals:
                for s in APPROVAL_STATES:
                    approval.add_metric([name, s], 1.0 if s == current else 0.0)
            for name, n_clients, n_tools in snap.endpoints:
                ep_clients.add_metric([name], n_clients)
                ep_tools.add_metric([name], n_tools)
        return [info, state, tools, size, version, clients, quarantined, approval, ep_clients, ep_tools]


class Metrics:
    """Every toolatlas metric, registered on one registry.

    `registry=None` creates a private `CollectorRegistry` (tests, and several daemons in one
    process never collide); the process-wide default registry is never touched.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        upstream_states: Sequence[str] = DEFAULT_UPSTREAM_STATES,
    ) -> None:
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ns = NAMESPACE
        self.search_latency = Histogram(
            "search_latency_seconds", "tool_search latency by ranking mode and result-cache use.",
            ["mode", "cache"], namespace=ns, registry=r, buckets=SEARCH_BUCKETS,
        )
        self.search_results = Histogram(
            "search_results", "Matches returned per tool_search.",
            ["mode"], namespace=ns, registry=r, buckets=RESULT_BUCKETS,
        )
        self.execute_latency = Histogram(
            "execute_latency_seconds", "execute_tool latency by upstream and outcome.",
            ["upstream", "outcome"], namespace=ns, registry=r, buckets=CALL_BUCKETS,
        )
        self.upstream_call_latency = Histogram(
            "upstream_call_latency_seconds",
            "Latency of requests to upstreams (call_tool, list_tools, ping, connect).",
            ["upstream", "operation"], namespace=ns, registry=r, buckets=CALL_BUCKETS,
        )

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, list(labels), namespace=ns, registry=r)

        self.searches = counter("searches", "tool_search requests served.", ["mode"])
        self.calls = counter("calls", "execute_tool requests by upstream and outcome.", ["upstream", "outcome"])
        self.errors = counter("errors", "Errors by type (exception class).", ["type"])
        self.fallbacks = counter("fallbacks",
            "Degraded operation: bm25-only search or passthrough listing.", ["kind"])
        self.cache_hits = counter("search_cache_hits", "tool_search answers served from the result cache.")
        self.cache_misses = counter("search_cache_misses", "tool_search answers computed afresh.")
        self.reconnects = counter("upstream_reconnects",
            "Reconnect attempts of upstream sessions (each backoff retry counts).", ["upstream"])
        self.list_changed = counter("upstream_list_changed",
            "tools/list_changed notifications received.", ["upstream"])
        self.admin_commands = counter("admin_commands",
            "Operator commands on the socket (upstream list/restart/relist, reload) by "
            "outcome.", ["command", "outcome"])
        self.endpoint_requests = counter("endpoint_requests",
            "tools/list, tool_search and calls served, per endpoint.", ["endpoint", "kind"])
        self.approval_transitions = counter("upstream_approval_transitions",
            "Upstream approval decisions changed, by the new decision.", ["state"])
        self.denials = counter("access_denials",
            "Requests refused by access rules or authentication, by surface.", ["surface"])
        self.reindexes = counter("reindexes", "Search index rebuilds swapped in.")
        self.embeddings = counter("embeddings_computed", "Tool documents embedded (cache misses of the embedder).")
        self.feedback = counter("feedback_events",
            "Calls of a tool a search returned on the same connection, by outcome "
            "(recorded as a usage event, call_failed, outside_window, dropped: the writer far behind).", ["outcome"])
        self._state = _StateCollector(upstream_states)
        r.register(self._state)
        self.bound_address: tuple[str, int] | None = None
        # The labelled children of every labelled metric, by (metric, label values): `labels()`
        # validates and locks on every call (~2 us each, four per search, one per upstream
        # request). Children are never removed, so a kept one stays the exported one.
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

    def __repr__(self) -> str:
        return f"<Metrics bound={self.bound_address}>"

    # -- recording ---------------------------------------------------------------------

    def _child(self, metric: Histogram | Counter, *values: str) -> Any:
        """`metric.labels(*values)`, kept: the values are checked by the caller."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe_search(self, seconds: float, *, mode: str, cache_hit: bool, results: int) -> None:
        """One tool_search: latency, result count, cache hit or miss."""
        mode = _label("mode", mode)
        self._child(self.search_latency, mode, "hit" if cache_hit else "miss").observe(seconds)
        self._child(self.search_results, mode).observe(results)
        self._child(self.searches, mode).inc()
        (self.cache_hits if cache_hit else self.cache_misses).inc()

    def observe_execute(self, seconds: float, *, upstream: str, outcome: str) -> None:
        """One execute_tool; `outcome` is one of ok|error|timeout|unavailable|denied|bad_input.

        `upstream` may be "" when the name resolved to no upstream (exported as "none").
        """
        if outcome not in EXECUTE_OUTCOMES:
            raise ValueError(f"execute outcome {outcome!r} is not one of {sorted(EXECUTE_OUTCOMES)}")
        up = _label("upstream", upstream or "none")
        self._child(self.execute_latency, up, outcome).observe(seconds)
        self._child(self.calls, up, outcome).inc()

    def observe_upstream_call(self, seconds: float, *, upstream: str, operation: str) -> None:
        """One request to an upstream (`operation`: call_tool, list_tools, ping, connect, ...)."""
        up, op = _label("upstream", upstream), _label("operation", operation)
        self._child(self.upstream_call_latency, up, op).observe(seconds)

    def count_error(self, error_type: str) -> None:
        """An error by type; pass `type(exc).__name__` or a short fixed code."""
        self._child(self.errors, _label("error type", error_type)).inc()

    def count_fallback(self, kind: str) -> None:
        """A degraded answer: "bm25-only" (no embedder) or "passthrough"."""
        if kind not in FALLBACK_KINDS:
            raise ValueError(f"fallback kind {kind!r} is not one of {sorted(FALLBACK_KINDS)}")
        self._child(self.fallbacks, kind).inc()

    def count_reconnect(self, upstream: str) -> None:
        self._child(self.reconnects, _label("upstream", upstream)).inc()

    def count_list_changed(self, upstream: str) -> None:
        self._child(self.list_changed, _label("upstream", upstream)).inc()

    def count_admin_command(self, command: str, outcome: str) -> None:
        """One operator command: `command` from ADMIN_COMMANDS, `outcome` from ADMIN_OUTCOMES."""
        if command not in ADMIN_COMMANDS or outcome not in ADMIN_OUTCOMES:
            raise ValueError(f"admin command {command!r} / outcome {outcome!r} is not a known pair")
        self._child(self.admin_commands, command, outcome).inc()

    def count_endpoint_request(self, endpoint: str, kind: str) -> None:
        """A request served on `endpoint` (`kind`: tools_list, tool_search, call)."""
        self._child(self.endpoint_requests, _label("endpoint", endpoint), _label("kind", kind)).inc()

    def count_approval(self, state: str) -> None:
        """An approval transition into `state` (pending, approved, rejected)."""
        self._child(self.approval_transitions, _label("state", state)).inc()

    def count_denial(self, surface: str) -> None:
        """An access denial (`surface`: tool_search, execute_tool, direct, http)."""
        self._child(self.denials, _label("surface", surface)).inc()

    def count_feedback(self, outcome: str) -> None:
        """One call after a search: `outcome` from FEEDBACK_OUTCOMES."""
        if outcome not in FEEDBACK_OUTCOMES:
            raise ValueError(f"feedback outcome {outcome!r} is not one of {sorted(FEEDBACK_OUTCOMES)}")
        self._child(self.feedback, outcome).inc()

    def forget_upstream(self, upstream: str) -> None:
        """Drop every series labelled with `upstream`, which a reload took out of the config:
        a scrape then shows only configured upstreams, and one added again starts from 0 (a
        counter reset, as after a restart)."""
        per_upstream = (self.execute_latency, self.upstream_call_latency, self.calls, self.reconnects, self.list_changed)
        for key in [k for k in self._children if k[0] in per_upstream and k[1][0] == upstream]:
            metric: Any = key[0]
            metric.remove(*key[1])
            del self._children[key]

    def count_reindex(self) -> None:
        self.reindexes.inc()

    def count_embeddings(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"embedding count {n} is negative")
        self.embeddings.inc(n)

    def set_state_source(self, fn: Callable[[], StateSnapshot]) -> None:
        """Install the callback read at every scrape for the state gauges.

        It runs on the event loop thread (the listener's), so it may read loop-owned state
        without locks; keep it cheap. If it raises, the scrape still succeeds without the
        state gauges and the error is logged.
        """
        self._state.source = fn

    def expose(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition body and its content type, negotiated from an Accept header."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    # -- HTTP --------------------------------------------------------------------------

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve `/metrics` on host:port until cancelled.

        Signals started with the bound (host, port) (port 0 picks a free one; also kept in
        `self.bound_address`). A bind failure raises `MetricsBindError` naming the address,
        before started, so `await tg.start(metrics.serve, ...)` fails the daemon's startup.
        """
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            listener = await anyio.create_tcp_listener(
                local_host=host or None, local_port=port, reuse_port=False
            )
        except OSError as exc:
            raise MetricsBindError(
                f"cannot serve Prometheus metrics on {where}: {exc.strerror or exc}"
            ) from exc
        async with listener:
            sockname = listener.listeners[0].extra(anyio.abc.SocketAttribute.local_address)
            bound = (str(sockname[0]), int(sockname[1]))
            self.bound_address = bound
            logger.info("Prometheus metrics on http://%s:%d/metrics", host or "0.0.0.0", bound[1])
            task_status.started(bound)
            try:
                await listener.serve(self._handle)
            finally:
                self.bound_address = None

    async def _handle(self, stream: SocketStream) -> None:
        # Every failure stays inside this connection: the listener keeps serving.
        async with stream:
            try:
                with anyio.fail_after(_REQUEST_TIMEOUT):
                    head = await _read_head(stream)
                    if head is None:
                        return
                    status, headers, body = self._respond(head)
                    await stream.send(_http_response(status, headers, body))
            except (TimeoutError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                return
            except Exception:
                logger.exception("metrics request failed")

    def _respond(self, head: bytes) -> tuple[str, dict[str, str], bytes]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return "400 Bad Request", {}, b"bad request\n"
        method, target, _ = parts
        hdrs = {}
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if sep:
                hdrs[k.strip().lower()] = v.strip()
        path = target.split("?", 1)[0]
        if path not in ("/metrics", "/"):
            return "404 Not Found", {}, b"not found; try /metrics\n"
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", {"Allow": "GET, HEAD"}, b"method not allowed\n"
        if path == "/":
            body = b'<html><body><a href="/metrics">/metrics</a></body></html>\n'
            return "200 OK", {"Content-Type": "text/html"}, body
        body, content_type = self.expose(hdrs.get("accept", ""))
        return "200 OK", {"Content-Type": content_type}, b"" if method == "HEAD" else body


async def _read_head(stream: SocketStream) -> bytes | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > _MAX_REQUEST_HEAD:
            return None
        try:
            buf += await stream.receive(4096)
        except anyio.EndOfStream:
            return None
    return buf.split(b"\r\n\r\n", 1)[0]


def _http_response(status: str, headers: dict[str, str], body: bytes) -> bytes:
    headers = {"Content-Type": "text/plain; charset=utf-8", **headers}
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
