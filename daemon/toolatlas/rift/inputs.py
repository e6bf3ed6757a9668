"""What Rift analyses, built from tools however they were found: `build_inputs` turns tools
and the text the index holds for them into `report.analyse()` inputs.

Library code shared by the daemon (over the engine's documents) and `toolatlas rift` (over
live upstreams or a catalog file); it lives here, not in rift/cli.py, because no library
module may import a CLI module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from toolatlas.retrieval.text import dense_text


class RiftTool(Protocol):
    """What Rift reads of a tool: a catalog.model.ToolRecord or a retrieval ToolDoc."""

    @property
    def name(self) -> str: ...  # namespaced
    @property
    def server(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def input_schema(self) -> dict[str, Any]: ...


# (tool, its summary, its server's summary, its server's tags): the text the index holds
InputRow = tuple[RiftTool, str, str, tuple[str, ...]]


def param_text(schema: Any) -> str:
    """Parameter names and descriptions of an input schema, space-separated."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return ""
    bits = []
    for k, spec in props.items():
        bits.append(k)
        if isinstance(spec, dict) and isinstance(spec.get("description"), str):
            bits.append(spec["description"])
    return " ".join(bits)


def build_inputs(
    rows: Sequence[InputRow],
) -> tuple[list[tuple[str, str]], dict[str, Mapping[str, Any]], dict[str, str]]:
    """(tool, summary, server summary, tags) rows -> analyse() inputs: documents as the
    retrieval engine builds them, schemas, and layer-3 texts (summary + parameters)."""
    tools: list[tuple[str, str]] = []
    schemas: dict[str, Mapping[str, Any]] = {}
    token_texts: dict[str, str] = {}
    for rec, summary, server_summary, tags in rows:
        tools.append((rec.name, dense_text(rec.tool, rec.server, summary, rec.input_schema, server_summary, tags)))
        schemas[rec.name] = rec.input_schema
        token_texts[rec.name] = f"{summary} {param_text(rec.input_schema)}"
    return tools, schemas, token_texts


def catalog_rows(path: str | os.PathLike[str], generator: str) -> list[InputRow]:
    """Rows for the tools of a catalog file: the publisher's text (`generator` "publisher")
    or the text a card generator ("bootstrap", ...) would give. CatalogFileError names a
    bad line; GeneratorError a generator failure."""
    from toolatlas.catalog.catalog_file import load_records
    from toolatlas.catalog.generators import make_generator

    rows: list[InputRow] = []
    for server, recs in load_records(path).items():
        if generator == "publisher":
            rows.extend((r, r.description, "", ()) for r in recs)
            continue
        draft = make_generator(generator).generate(server, recs)
        by = {d.tool: d.summary for d in draft.tools}
        rows.extend((r, by[r.tool], draft.summary, draft.tags) for r in recs)
    return rows
