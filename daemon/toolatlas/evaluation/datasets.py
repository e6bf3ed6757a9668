"""Evaluation data (catalog.jsonl, queries.jsonl; see docs/interface.md) as engine inputs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from toolatlas.catalog.catalog_file import read_catalog, read_json_lines
from toolatlas.errors import BadInput
from toolatlas.names import namespaced
from toolatlas.retrieval.documents import ToolDoc

_SLUG = re.compile(r"[^a-z0-9-]+")
MISSING = "<missing>"  # prefix of a relevance label naming no tool of the catalog


def benchdata_dir() -> Path:
    """`../shared/benchdata` relative to the repository root."""
    return Path(__file__).resolve().parents[3] / ".." / "shared" / "benchdata"


@dataclass(frozen=True)
class Query:
    text: str
    relevant: frozenset[str]  # ToolDoc names
    principal: str | None = None  # who asked (feedback files); None: the evaluating user


def server_slug(server: str) -> str:
    return _SLUG.sub("-", server.lower()).strip("-") or "server"


def load_catalog(path: Path) -> tuple[list[ToolDoc], dict[tuple[str, str], str]]:
    """ToolDocs plus the map (server, tool) -> doc name used to resolve relevance labels.

    The doc's server stays the dataset's server string (it is informative text, and it is
    the grouping unit for two-stage mode and scopes); the name is a unique namespaced key.
    """
    docs: list[ToolDoc] = []
    key_of: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    for line in read_catalog(path):
        server, tool = line.server, line.name
        name = namespaced(server_slug(server), tool)
        i = 1
        while name in used:
            i += 1
            name = f"{namespaced(server_slug(server), tool)[:58]}_{i}"
        used.add(name)
        key_of[(server, tool)] = name
        docs.append(
            ToolDoc(
                name=name,
                server=server,
                tool=tool,
                description=line.description,
                input_schema=line.input_schema,
            )
        )
    return docs, key_of


def load_queries(path: Path, key_of: dict[tuple[str, str], str]) -> list[Query]:
    """Queries with relevance resolved to doc names; unknown relevant tools stay counted."""
    out = []
    for no, obj in read_json_lines(path):
        if not isinstance(obj.get("query"), str) or not isinstance(obj.get("relevant"), list):
            raise BadInput(f"{path}:{no}: a query line needs a 'query' string and a 'relevant' list")
        rel = set()
        for r in obj["relevant"]:
            # a missing or non-string server or name would be looked up as "None" or "['a']"
            # and reported as a tool missing from the catalog, not as this line's mistake
            if not isinstance(r, dict) or not isinstance(r.get("server"), str) or not isinstance(r.get("name"), str):
                raise BadInput(f"{path}:{no}: each 'relevant' entry must be an object "
                               f'{{"server": "...", "name": "..."}} with string values, got {json.dumps(r)[:80]}')
            key = (r["server"], r["name"])
            rel.add(key_of.get(key, f"{MISSING}{key[0]}/{key[1]}"))
        principal = obj.get("principal")
        if principal is not None and (not isinstance(principal, str) or not principal.strip()):
            raise BadInput(f"{path}:{no}: 'principal' must be a non-empty string (who asked, e.g. \"uid:1000\"), "
                           f"got {json.dumps(principal)[:80]}")
        out.append(Query(text=str(obj["query"]), relevant=frozenset(rel), principal=principal))
    return out


def unresolved_warning(path: Path | None, queries: list[Query], *, feedback: bool = False) -> str | None:
    """One line when some queries can never score: a relevant tool not in the catalog (it
    stays counted, so such a query's recall is below 1 whatever the ranker does) or no
    relevant tool at all (every metric 0). None when every label resolved. A wrong catalog
    for the queries file shows here instead of as quietly low figures. `feedback`: the
    lines are usage events to replay, and such a line's events are left out instead."""
    missing = sorted({r[len(MISSING):] for q in queries for r in q.relevant if r.startswith(MISSING)})
    affected = sum(1 for q in queries if not q.relevant or any(r.startswith(MISSING) for r in q.relevant))
    if not affected:
        return None
    empty = sum(1 for q in queries if not q.relevant)
    parts = []
    if missing:
        parts.append(f"{len(missing)} relevant tool(s) not in the catalog (e.g. {', '.join(missing[:3])})")
    if empty:
        parts.append(f"{empty} with an empty 'relevant' list")
    if feedback:
        return (f"{path}: {affected} of {len(queries)} feedback lines are not replayed in full: "
                f"{'; '.join(parts)}; no usage event is made for those")
    return f"{path}: {affected} of {len(queries)} queries cannot score fully: {'; '.join(parts)}; they count as misses"


def resolved_events(queries: list[Query]) -> int:
    """How many usage events `queries` replay as feedback: one per relevant tool of the catalog."""
    return sum(1 for q in queries for r in q.relevant if not r.startswith(MISSING))
