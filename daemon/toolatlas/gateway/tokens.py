"""Catalog token accounting for catalog_status, recounted in a worker thread when the
index version moves. It reads one `CatalogView`, never the live catalog."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from toolatlas.catalog.model import ToolRecord
from toolatlas.gateway.view import CatalogView
from toolatlas.meta_tools import META_TOOLS
from toolatlas.retrieval.engine import Engine

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


def token_report(view: CatalogView, engine: Engine, version: int, scope: Scope = None) -> dict[str, Any]:
    """Tokens of the catalog (of the servers in `scope`) as tools/list, of the meta-tools, and
    of sample top-5 answers (queries made from tool names, spread over the catalog)."""
    from toolatlas.tokens import catalog_token_report

    servers = view.available if scope is None else view.available & scope
    by_name = view.by_name
    records = sorted((r for r in by_name.values() if r.server in servers), key=lambda r: r.name)
    samples = []
    step = max(1, len(records) // TOKEN_SAMPLE_QUERIES)
    for rec in records[::step][:TOKEN_SAMPLE_QUERIES]:
        query = " ".join(rec.tool.replace("_", " ").replace("-", " ").split())
        outcome = engine.search(query, 5, servers=servers)
        samples.append({"query": query, "matches": [
            {"name": h.name, "server": h.server, "tool": by_name[h.name].tool,
             "description": by_name[h.name].description,
             "inputSchema": by_name[h.name].input_schema, "score": round(h.score, 6)}
            for h in outcome.hits if h.name in by_name
        ], "degraded": outcome.degraded})
    report = catalog_token_report([tool_dict(r) for r in records], META_TOOLS, samples or None)
    report["index_version"] = version
    return report


class TokenReporter:
    """The latest token report per scope (a caller sees figures over the servers it may use
    only); `ensure()` starts a recount of a scope when the index moved."""

    MAX_SCOPES = 32  # distinct server sets kept (one per [[access]] outcome, in practice)

    def __init__(self, engine: Engine, view: Callable[[], CatalogView]) -> None:
        self._engine = engine
        self._view = view
        self._reports: OrderedDict[Scope, tuple[int, dict[str, Any]]] = OrderedDict()
        self._running: set[Scope] = set()

    def report(self, scope: Scope = None) -> dict[str, Any] | None:
        got = self._reports.get(scope)
        return got[1] if got is not None else None

    def ensure(self, tg: anyio.abc.TaskGroup | None, scope: Scope = None) -> None:
        version = self._engine.version
        got = self._reports.get(scope)
        if (got is not None and got[0] == version) or scope in self._running or tg is None:
            return
        self._running.add(scope)
        tg.start_soon(self._compute, version, scope)

    async def _compute(self, version: int, scope: Scope) -> None:
        view = self._view()
        try:
            report = await anyio.to_thread.run_sync(token_report, view, self._engine, version, scope)
        except Exception as exc:  # token figures are informative; never break status
            log.warning("token accounting failed: %s", exc)
            report = {"error": str(exc)}
        finally:
            self._running.discard(scope)
        self._reports[scope] = (version, report)
        self._reports.move_to_end(scope)
        while len(self._reports) > self.MAX_SCOPES:
            self._reports.popitem(last=False)


__all__ = ["TOKEN_SAMPLE_QUERIES", "Scope", "TokenReporter", "token_report", "tool_dict"]
