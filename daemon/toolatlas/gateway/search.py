"""tool_search: scope, the engine (cache first, then a worker thread), the answer and its
Rift notes, counted in the metrics and the event log."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

import anyio

from toolatlas import events as ev
from toolatlas.errors import BadInput
from toolatlas.gateway.audit import bookkeep, deny, who
from toolatlas.gateway.catalog import LiveCatalog
from toolatlas.gateway.matches import MatchBuilder
from toolatlas.gateway.ports import Connection
from toolatlas.gateway.visibility import Visibility
from toolatlas.guidance import Guidance
from toolatlas.metrics import Metrics
from toolatlas.names import split
from toolatlas.retrieval import adaptive
from toolatlas.retrieval.embed import usable_cores
from toolatlas.retrieval.engine import SearchOutcome
from toolatlas.rift.report import RiftReport

# How long tool_search waits for a first index before answering degraded.
INDEX_WAIT_S = 10.0
# Of the query the answer echoes: a query of a megabyte was sent back twice (text and structuredContent).
QUERY_ECHO_CHARS = 1000


class SearchService:
    """Answers tool_search for a connection over the catalog's current view."""

    def __init__(
        self, catalog: LiveCatalog, visibility: Visibility, *, mode: Callable[[], str],
        rift: Callable[[], RiftReport | None], metrics: Metrics, events: ev.Events,
        starting: Callable[[set[str]], list[str]] = lambda _allowed: [],
        guidance: Callable[[Connection], Guidance] | None = None,
        max_top_k: Callable[[], int] = lambda: 5, held: Callable[[str], str | None] = lambda _server: None,
        unsearchable: Callable[[str], str] = lambda server: f"upstream {server!r} is not available right now",
    ) -> None:
        """`starting(allowed)`: what the daemon still waits for before its first index is
        ready (empty once it is); an answer given meanwhile carries it as `waiting_for`.
        `guidance(conn)`: what that connection is shown of publisher text. `held(server)`: why
        a configured upstream serves nothing now (awaiting approval, rejected), or None.
        `unsearchable(server)`: why an upstream the caller may use is out of search now."""
        self._held = held
        self._unsearchable = unsearchable
        self._catalog = catalog
        self._guidance = guidance
        self._matches = MatchBuilder()
        self._starting = starting
        self._max_top_k = max_top_k
        # Hears every answer: (connection, query, the names of its matches). Set by the gateway (learning).
        self.on_answer: Callable[[Connection, str, list[str]], None] | None = None
        self._visibility = visibility
        self._mode = mode
        self._rift = rift
        self._metrics = metrics
        self._events = events
        # Searches are CPU work (query embedding, ranking): as many at once as there are
        # cores this process may use (its affinity mask, as the embedder counts them). More
        # threads only thrash the caches and grow the heap (a malloc arena each).
        self._limiter = anyio.CapacityLimiter(max(2, usable_cores()))

    def cached(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any] | None:
        """`search`'s answer when the result cache holds it (counted and logged as `search`
        does), else None with nothing counted; BadInput as `search` raises it. Synchronous
        and cheap: the socket's lane answers a repeated query with it without a task or a
        thread hop."""
        t0 = time.perf_counter()
        if not self._catalog.engine_loaded.is_set():
            return None
        allowed = self._visibility.allowed_servers(conn)
        # a denial is recorded by `search`
        scope = self._visibility.search_scope(servers, allowed, self.held_for(servers, allowed, conn))
        k = top_k or self._max_top_k()
        outcome = self._catalog.engine.cached(query, k, servers=scope, principal=conn.principal) if scope else None
        if outcome is None:
            return None
        return self._answer(query, top_k, servers, scope, outcome, outcome.mode, t0, allowed, conn)

    def _scope(self, servers: list[str] | None, allowed: set[str], conn: Connection) -> set[str]:
        """`Visibility.search_scope`; naming a configured server `conn` may not use is also
        recorded as an access denial (one its rules give it, held by the operator, is not:
        the answer says why it serves nothing)."""
        held = self.held_for(servers, allowed, conn)
        try:
            return self._visibility.search_scope(servers, allowed, held)
        except BadInput:
            refused = sorted(s for s in servers or () if s not in allowed and s not in held
                             and self._visibility.configured(s))
            if refused:
                deny(self._events, self._metrics, conn, "tool_search", ",".join(refused)[:200],
                     f"{conn.principal} may not use upstream(s) {', '.join(refused)}")
            raise

    def held_for(self, servers: list[str] | None, allowed: set[str], conn: Connection) -> dict[str, str]:
        """Of `servers` that `conn` cannot use now, those its rules give it but the operator
        holds (awaiting approval, rejected): server -> why. Told apart from unknown names, and
        no access denial; not looked up when every named server is usable."""
        asked = [s for s in servers or () if s not in allowed]
        permitted = self._visibility.permitted(conn) if asked else set()
        return {s: why for s in asked if s in permitted and (why := self._held(s))}

    async def search(self, query: str, top_k: int, servers: list[str] | None, conn: Connection) -> dict[str, Any]:
        t0 = time.perf_counter()
        allowed = self._visibility.allowed_servers(conn)
        scope = self._scope(servers, allowed, conn)
        k = top_k or self._max_top_k()
        outcome: SearchOutcome | None = None
        mode = self._mode()
        loaded = self._catalog.engine_loaded
        if not loaded.is_set():
            with anyio.move_on_after(INDEX_WAIT_S):
                await loaded.wait()
        if loaded.is_set() and scope:
            engine = self._catalog.engine
            frozen = frozenset(scope)
            # A repeated query is answered from the result cache here, without a thread hop.
            found = engine.cached(query, k, servers=scope, principal=conn.principal)
            if found is None:
                found = await anyio.to_thread.run_sync(
                    lambda: engine.search(query, k, servers=frozen, principal=conn.principal),
                    limiter=self._limiter,
                )
            outcome, mode = found, found.mode
        return self._answer(query, top_k, servers, scope, outcome, mode, t0, allowed, conn)

    def _answer(
        self, query: str, top_k: int, servers: list[str] | None, scope: set[str],
        outcome: SearchOutcome | None, mode: str, t0: float, allowed: set[str], conn: Connection,
    ) -> dict[str, Any]:
        """The tool_search result for `outcome` (None: no index yet, or an empty scope),
        counted in the metrics and the event log. `top_k` 0: the caller left it out (see
        adaptive.py; only where the dense branch answered, BM25 alone is not calibrated)."""
        loaded = self._catalog.engine_loaded.is_set()
        degraded = outcome.degraded if outcome is not None else (None if loaded else "index-not-ready")
        cached = outcome is not None and outcome.cached
        view = self._catalog.view
        by_name = view.by_name
        publisher_text = self._guidance(conn).publisher_text if self._guidance is not None else "omit"
        limit = top_k or self._max_top_k()
        matches: list[dict[str, Any]] = []
        for hit in outcome.hits if outcome is not None else ():
            rec = by_name.get(hit.name)
            if rec is None or rec.server not in scope:
                continue
            matches.append(self._matches.match(rec, view.server(rec.server).verdict, hit.score,
                                               publisher_text=publisher_text))
            if len(matches) >= limit:
                break
        note: str | None = None
        if not top_k and outcome is not None and outcome.evidence is not None:
            if adaptive.nothing_fits(*outcome.evidence):
                matches = []
                names = sorted(scope)
                note = (f"No tool fits this query well. Searchable servers: {', '.join(names)}. "
                        "Rephrase the query with what the tool should do, or pass top_k to see the closest tools anyway.")
            else:
                matches = matches[: adaptive.cut([m["score"] for m in matches], self._max_top_k())]
        if note is None:
            note = self._note(matches, servers, scope, allowed, loaded, conn)
        add_rift_notes(self._rift(), matches, allowed, live=by_name)
        seconds = time.perf_counter() - t0
        names = [m["name"] for m in matches]
        servers_matched = sorted({m["server"] for m in matches})

        def bookkeeping() -> None:
            """The metrics, the event lines and the learning hook (what was shown)."""
            self._metrics.observe_search(seconds, mode=mode, cache_hit=cached, results=len(names))
            self._metrics.count_endpoint_request(conn.endpoint, "tool_search")
            if degraded:
                # No index yet: passthrough lists; any other degradation is a search without its dense branch.
                self._metrics.count_fallback("passthrough" if degraded == "index-not-ready" else "bm25-only")
                self._events.emit(ev.TOOL_SEARCH_FALLBACK, reason=degraded, mode=mode)
            self._events.emit(
                ev.TOOL_SEARCH_COMPLETED, query=query, results=len(names), matched_servers=servers_matched,
                latency_ms=round(seconds * 1000, 3), top_k=limit, scope=sorted(set(servers)) if servers else "all",
                mode=mode, cache="hit" if cached else "miss", **who(conn),
            )
            if self.on_answer is not None:
                self.on_answer(conn, query, names)

        # After the answer's write (the socket's lane writes a cache hit at once, a miss's task
        # sends it), or before it with an audit trail.
        bookkeep(self._events, ev.TOOL_SEARCH_COMPLETED, bookkeeping)
        echo = query if len(query) <= QUERY_ECHO_CHARS else f"{query[:QUERY_ECHO_CHARS]}... ({len(query)} characters)"
        answer: dict[str, Any] = {"query": echo, "matches": matches, "degraded": degraded}
        if note is not None:
            answer["note"] = note
        waiting = self._starting(allowed)
        if waiting:
            answer["waiting_for"] = waiting  # still starting: these matches may be incomplete
        return answer

    def _note(self, matches: list[dict[str, Any]], servers: list[str] | None, scope: set[str], allowed: set[str],
              loaded: bool, conn: Connection) -> str | None:
        """What a model reads beside an answer without matches (why, and what to do next), or
        beside one that left out a server it named; None for an answer that needs none."""
        named = set(servers) if servers is not None else None
        skipped = sorted((named if named is not None else allowed) - scope)
        if matches and (named is None or not skipped):
            return None
        parts: list[str] = []
        # servers its rules give it that the operator holds (awaiting approval, rejected): said as a scoped search says them
        held = self.held_for(sorted(self._visibility.permitted(conn) - allowed), allowed, conn) \
            if not matches and servers is None else {}
        if not loaded:
            parts.append("The gateway is still building its search index; search again in a few seconds.")
        elif not allowed and not held:
            parts.append("No upstream server is open to you on this gateway.")
        elif not matches and scope:
            view = self._catalog.view
            empty = sorted(s for s in scope if not view.server(s).records)  # listed no tools (now)
            if len(empty) == len(scope):  # no query can match: rephrasing is no use
                parts.append(f"No tool to search: {', '.join(empty)} list(s) no tools now. "
                             "Search again once they list some (catalog_status shows their tool counts).")
            else:
                parts.append(f"No tool matched this query. Searchable servers: {', '.join(sorted(scope))}"
                             + (f" ({', '.join(empty)} list(s) no tools now)" if empty else "")
                             + ". Rephrase the query with what the tool should do.")
        unsearchable = [self._unsearchable(s)[:NOTE_REASON_CHARS] for s in skipped[:NOTE_SERVERS]] if loaded else []
        unsearchable += [f"server {s!r} serves nothing now ({why})" for s, why in list(held.items())[:NOTE_SERVERS]]
        if unsearchable:
            more = f" (+{len(skipped) - NOTE_SERVERS} more: catalog_status)" if len(skipped) > NOTE_SERVERS else ""
            parts.append("Not searched: " + " | ".join(unsearchable) + more + ".")
        return " ".join(parts) or None


NOTE_SERVERS = 5  # unsearchable servers a note explains at most
NOTE_REASON_CHARS = 240  # of each one's reason (it may quote an upstream's stderr)
NOTE_SIBLINGS = 3  # other tools a Rift note names at most


def add_rift_notes(
    report: RiftReport | None, matches: list[dict[str, Any]], allowed: set[str], *, live: Collection[str],
) -> None:
    """Matches that share a HIGH/MEDIUM Rift cluster get one note per answer, on the best
    ranked of them: which tools it is easily confused with (at most NOTE_SIBLINGS, those in
    the answer first) and the words that set each apart. Only siblings on servers in
    `allowed` (those the caller may use) and in `live` (the callable catalog now) are ever
    named: the report describes the index Rift last analysed, and a tool removed or
    quarantined since is in its clusters until the next analysis (after a quiet second, at most
    RIFT_MAX_DELAY_S after the first change it has not analysed)."""
    if report is None or len(matches) < 2:
        return

    def visible(name: str) -> bool:
        parsed = split(name)
        return parsed is not None and parsed[0] in allowed and name in live

    done: set[int] = set()
    for m in matches:
        diag = report.tools.get(m["name"])
        if diag is None or diag.cluster in done or report.clusters[diag.cluster].risk not in ("high", "medium"):
            continue
        in_answer = [x["name"] for x in matches if x["name"] != m["name"]
                     and (d := report.tools.get(x["name"])) is not None and d.cluster == diag.cluster]
        if not in_answer:
            continue
        done.add(diag.cluster)
        members = report.clusters[diag.cluster].members
        others = list(dict.fromkeys([*in_answer, *(n for n in members if n != m["name"])]))
        others = [n for n in others if visible(n)]
        if not others:
            continue
        shown = others[:NOTE_SIBLINGS]
        more = f" (+{len(others) - len(shown)} more)" if len(others) > len(shown) else ""
        apart = [f"{n}: {', '.join(t.distinguishing[:3])}" for n in (m["name"], *shown)
                 if (t := report.tools.get(n)) is not None and t.distinguishing]
        m["note"] = (f"Easily confused with {', '.join(shown)}{more}"
                     + (f"; what sets each apart: {'; '.join(apart)}." if apart else
                        "; their descriptions do not tell them apart."))


__all__ = ["INDEX_WAIT_S", "NOTE_SIBLINGS", "SearchService", "add_rift_notes"]
