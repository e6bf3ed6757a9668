"""The one reader of catalog files: JSONL, one tool a line (docs/interface.md).

    {"server": str, "name": str, "description": str, "input_schema": object, ...}

`toolatlas eval`, `toolatlas cards ... --catalog`, `toolatlas rift --catalog` and the bench
scripts all read catalogs here, so a line means the same thing to each of them:

* `server` and `name` are required (any JSON value, taken as its string form);
* a missing or null `description` is "";
* an `input_schema` that is missing or not an object is `{"type": "object"}`;
* a (server, name) pair seen again is skipped: the first line wins;
* other keys are ignored, but kept in `CatalogLine.raw` for tools that rewrite lines.

A file that cannot be read, a line that is not a JSON object, or one without `server` and
`name`, raises CatalogFileError (a BadInput) naming the file and line number; so does a file
with no tool at all (every reader is a command run on a file a person named: an empty one is a
wrong path or a failed export, and a Rift gate or an evaluation over nothing would pass).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from toolatlas.catalog.model import ToolRecord
from toolatlas.errors import BadInput

_DEFAULT_SCHEMA: dict[str, Any] = {"type": "object"}


class CatalogFileError(BadInput):
    """A catalog (or other JSONL) file that cannot be read, or a line that is not usable."""


class CatalogLine(msgspec.Struct, frozen=True, kw_only=True):
    """One tool of a catalog file, fields normalised as the module docstring says."""

    lineno: int  # 1-based line number in the file
    server: str
    name: str  # the tool's own (upstream) name, not namespaced
    description: str
    input_schema: dict[str, Any]
    raw: dict[str, Any]  # the line as parsed, every key included

    def record(self) -> ToolRecord:
        """This tool as a ToolRecord (namespaced name, content hash)."""
        return ToolRecord.make(self.server, self.name, self.description, self.input_schema)


def read_json_lines(path: str | os.PathLike[str]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a JSONL file whose lines are objects.

    Raises CatalogFileError if the file cannot be read or a line is not a JSON object."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogFileError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CatalogFileError(f"{path}: not UTF-8 text: {exc}") from exc
    out: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise CatalogFileError(f"{path}:{lineno}: not valid JSON: {exc}") from exc
        except RecursionError:  # the decoder's nesting limit (thousands of levels), not a crash
            raise CatalogFileError(f"{path}:{lineno}: not valid JSON: nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise CatalogFileError(f"{path}:{lineno}: expected a JSON object")
        out.append((lineno, obj))
    return out


def read_catalog(path: str | os.PathLike[str]) -> list[CatalogLine]:
    """The tools of a catalog file in file order, each (server, name) once. See the module
    docstring for how a line is read; CatalogFileError names the bad line."""
    lines: list[CatalogLine] = []
    seen: set[tuple[str, str]] = set()
    for lineno, obj in read_json_lines(path):
        if "server" not in obj or "name" not in obj:
            raise CatalogFileError(f"{path}:{lineno}: a catalog line needs 'server' and 'name'")
        server, name = str(obj["server"]), str(obj["name"])
        if (server, name) in seen:
            continue
        seen.add((server, name))
        schema = obj.get("input_schema")
        lines.append(
            CatalogLine(
                lineno=lineno,
                server=server,
                name=name,
                description=str(obj.get("description") or ""),
                input_schema=schema if isinstance(schema, dict) else dict(_DEFAULT_SCHEMA),
                raw=obj,
            )
        )
    if not lines:
        raise CatalogFileError(f"{path}: holds no tools (a catalog file has one JSON object a line, "
                               '{"server": ..., "name": ..., "description": ..., "input_schema": ...})')
    return lines


def records_by_server(lines: Iterable[CatalogLine]) -> dict[str, list[ToolRecord]]:
    """{server: [ToolRecord, ...]} in file order (servers in order of first appearance)."""
    out: dict[str, list[ToolRecord]] = {}
    for line in lines:
        out.setdefault(line.server, []).append(line.record())
    return out


def load_records(path: str | os.PathLike[str]) -> dict[str, list[ToolRecord]]:
    """A catalog file as {server: [ToolRecord, ...]}: what cards and Rift read offline."""
    return records_by_server(read_catalog(path))
