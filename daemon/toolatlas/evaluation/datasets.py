"""Evaluation data (catalog.jsonl, queries.jsonl; see docs/interface.md) as engine inputs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolatlas.errors import BadInput
from toolatlas.names import namespaced
from toolatlas.retrieval.engine import ToolDoc

_SLUG = re.compile(r"[^a-z0-9-]+")


def benchdata_dir() -> Path:
    """`../shared/benchdata` relative to the repository root."""
    return Path(__file__).resolve().parents[3] / ".." / "shared" / "benchdata"


@dataclass(frozen=True)
class Query:
    text: str
    relevant: frozenset[str]  # ToolDoc names


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"cannot read {str(path)!r}: {exc.strerror}") from exc
    out = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"{path}:{no}: not valid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise BadInput(f"{path}:{no}: expected a JSON object")
        out.append(obj)
    return out


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
    for no, obj in enumerate(_jsonl(path), start=1):
        try:
            server, tool = str(obj["server"]), str(obj["name"])
        except KeyError as exc:
            raise BadInput(f"{path}:{no}: a catalog line needs 'server' and 'name'") from exc
        if (server, tool) in key_of:
            continue
        name = namespaced(server_slug(server), tool)
        i = 1
        while name in used:
            i += 1
            name = f"{namespaced(server_slug(server), tool)[:58]}_{i}"
        used.add(name)
        key_of[(server, tool)] = name
        schema = obj.get("input_schema")
        docs.append(
            ToolDoc(
                name=name,
                server=server,
                tool=tool,
                description=str(obj.get("description") or ""),
                input_schema=schema if isinstance(schema, dict) else {"type": "object"},
            )
        )
    return docs, key_of


def load_queries(path: Path, key_of: dict[tuple[str, str], str]) -> list[Query]:
    """Queries with relevance resolved to doc names; unknown relevant tools stay counted."""
    out = []
    for no, obj in enumerate(_jsonl(path), start=1):
        if "query" not in obj or not isinstance(obj.get("relevant"), list):
            raise BadInput(f"{path}:{no}: a query line needs 'query' and a 'relevant' list")
        rel = set()
        for r in obj["relevant"]:
            key = (str(r.get("server")), str(r.get("name")))
            rel.add(key_of.get(key, f"<missing>{key[0]}/{key[1]}"))
        out.append(Query(text=str(obj["query"]), relevant=frozenset(rel)))
    return out
