"""Catalog token accounting for catalog_status, recounted when the index version moves. It
reads one `CatalogView`, never the live catalog: a worker thread gathers what is counted
(the tools, sample answers), a child process counts it (`toolatlas.tokens.main`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from toolatlas.catalog.model import ToolRecord
from toolatlas.gateway.view import CatalogView
from toolatlas.gateway.matches import MatchBuilder
from toolatlas.guidance import MetaTools
from toolatlas.meta_tools import META_TOOLS, render_compact
from toolatlas.retrieval.engine import Engine, ModelPhase
from toolatlas.tokens import evenly_sampled

log = logging.getLogger(__name__)

# Queries per catalog version used to measure the mean size of a top-5 tool_search result.
TOKEN_SAMPLE_QUERIES = 8


def tool_dict(rec: ToolRecord) -> dict[str, Any]:
    """A tool as a passthrough client's tools/list shows it (also what token figures count)."""
    out: dict[str, Any] = {"name": rec.name, "description": rec.description, "inputSchema": rec.input_schema}
    if rec.title:
        out["title"] = rec.title
    if rec.output_schema:
        out["outputSchema"] = rec.output_schema
    return out


Scope = frozenset[str] | None  # the servers a report covers; None: every server


def token_inputs(view: CatalogView, engine: Engine, scope: Scope = None,
                 meta: Sequence[Mapping[str, Any]] = META_TOOLS) -> bytes:
    """What a token report of the servers in `scope` counts, as the counting child's JSON
    input: the catalog as tools/list (an even sample above `tokens.EXACT_MAX` tools), the
    meta-tools (`meta`: as the caller reads them, templates rendered), and sample top-5
    answers (queries made from tool names, spread over the catalog) as tool_search gives
    them, in json and compact form."""
    servers = view.available if scope is None else view.available & scope
    by_name = view.by_name
    records = sorted((r for r in by_name.values() if r.server in servers), key=lambda r: r.name)
    samples = []
    step = max(1, len(records) // TOKEN_SAMPLE_QUERIES)
    builder = MatchBuilder()
    for rec in records[::step][:TOKEN_SAMPLE_QUERIES]:
        query = " ".join(rec.tool.replace("_", " ").replace("-", " ").split())
        outcome = engine.search(query, 5, servers=servers, internal=True)
        samples.append({"query": query, "matches": [
            builder.match(by_name[h.name], view.server(h.server).verdict, h.score)
            for h in outcome.hits if h.name in by_name
        ], "degraded": outcome.degraded})
    return json.dumps({
        "tools": [tool_dict(r) for r in evenly_sampled(records)],
        "catalog_size": len(records), "meta": [dict(t) for t in meta],
        "samples": samples or None, "compact": [render_compact(a) for a in samples] or None,
    }, ensure_ascii=False, separators=(",", ":")).encode()


COUNT_TIMEOUT = 300.0  # seconds for one count (of at most tokens.EXACT_MAX tools: seconds of CPU)
# Counting children at a time, per daemon: each is an interpreter with the tokenizer (~60 MB)
# and takes a core for seconds; callers with many different access scopes queue behind it.
COUNTS_AT_ONCE = 1
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding toolatlas/
COUNTER_ARGV: list[str] = [sys.executable, "-m", "toolatlas.tokens"]


async def count_in_child(payload: bytes, timeout: float | None = None,
                         limiter: anyio.CapacityLimiter | None = None) -> dict[str, Any]:
    """The report `toolatlas.tokens.main` makes of `payload`, counted in a child process
    that exits when done (killed if it takes longer than `timeout`, COUNT_TIMEOUT by
    default, or if the caller is cancelled). With `limiter`, the child starts only once
    the limiter has room (the wait does not count against `timeout`)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    async with limiter if limiter is not None else contextlib.nullcontext():
        with anyio.fail_after(COUNT_TIMEOUT if timeout is None else timeout):
            done = await anyio.run_process(COUNTER_ARGV, input=payload, env=env, check=False)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"the token counter exited with {done.returncode}: {lines[-1] if lines else 'no output'}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


class TokenReporter:
    """The latest token report per scope (a caller sees figures over the servers it may use
    only); `ensure()` starts a recount of a scope when the index moved."""

    MAX_SCOPES = 32  # distinct server sets kept (one per [[access]] outcome, in practice)

    def __init__(self, engine: Engine, view: Callable[[], CatalogView]) -> None:
        self._engine = engine
        self._view = view
        # scope -> ((index version, meta-tools fingerprint), report)
        self._reports: OrderedDict[Scope, tuple[tuple[int, str], dict[str, Any]]] = OrderedDict()
        self._running: set[Scope] = set()
        self._counts: anyio.CapacityLimiter | None = None  # COUNTS_AT_ONCE; made in the event loop

    def report(self, scope: Scope = None) -> dict[str, Any] | None:
        got = self._reports.get(scope)
        return got[1] if got is not None else None

    def ensure(self, tg: anyio.abc.TaskGroup | None, scope: Scope = None, meta: MetaTools | None = None) -> None:
        """Recount `scope` when the index or the meta-tools (`meta`, as its caller reads
        them: a reload with new templates) changed since its last report."""
        key = (self._engine.version, meta.fingerprint if meta is not None else "")
        got = self._reports.get(scope)
        if (got is not None and got[0] == key) or scope in self._running or tg is None or self._hybrid_imminent():
            return
        self._running.add(scope)
        tg.start_soon(self._compute, key, scope, meta.tools if meta is not None else META_TOOLS)

    def _hybrid_imminent(self) -> bool:
        """A replica's first hybrid index is on its way (the model loading or loaded, its
        vectors coming from the shared store, seconds away): count that version, not the
        BM25 one before it. A count takes a core for a second or more per 2,000 tools (in its
        child process; the sample searches in a thread here) and would slow the vector fetch
        and the HNSW build it waits for. Not while the model is
        exported, nor once this replica embeds documents itself (the store lacked them, or
        is down), nor without a shared store: the BM25 version may then stand for minutes."""
        engine = self._engine
        progress = engine.progress
        return (engine.shares_vectors and not progress.hybrid_once
                and progress.phase in (ModelPhase.WAITING, ModelPhase.LOADING, ModelPhase.EMBEDDING)
                and not engine.stats()["embeddings_computed"])

    async def _compute(self, key: tuple[int, str], scope: Scope, meta: Sequence[Mapping[str, Any]]) -> None:
        view = self._view()
        version = key[0]
        try:
            payload = await anyio.to_thread.run_sync(token_inputs, view, self._engine, scope, meta)
            if self._counts is None:
                self._counts = anyio.CapacityLimiter(COUNTS_AT_ONCE)
            report = await count_in_child(payload, limiter=self._counts)
            report["index_version"] = version
        except TimeoutError:
            log.warning("token accounting took over %.0f s; its counter was stopped", COUNT_TIMEOUT)
            report = {"error": f"the token count took over {COUNT_TIMEOUT:.0f} s and was stopped"}
        except Exception as exc:  # token figures are informative; never break status
            log.warning("token accounting failed: %s", exc)
            report = {"error": str(exc)}
        finally:
            self._running.discard(scope)
        self._reports[scope] = (key, report)
        self._reports.move_to_end(scope)
        while len(self._reports) > self.MAX_SCOPES:
            self._reports.popitem(last=False)


__all__ = ["TOKEN_SAMPLE_QUERIES", "Scope", "TokenReporter", "count_in_child", "token_inputs", "tool_dict"]
