"""Tool records as the gateway keeps them, with content hashes for change detection."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import msgspec

from toolatlas.catalog.schemas import intern_schema, repair_schema
from toolatlas.names import namespaced

_canon = msgspec.json.Encoder(order="sorted")


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8: the form hashes and signatures cover."""
    return _canon.encode(obj)


def schema_hash(tool: str, description: str, input_schema: dict[str, Any]) -> str:
    """SHA-256 over the upstream's name, description and inputSchema (hex)."""
    blob = canonical_json({"name": tool, "description": description, "inputSchema": input_schema})
    return hashlib.sha256(blob).hexdigest()


class ToolRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One upstream tool as offered through the gateway."""

    server: str
    tool: str  # the upstream's own name
    name: str  # the namespaced gateway name
    description: str
    input_schema: dict[str, Any]
    title: str | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    content_hash: str = ""
    # What toolatlas changed in the upstream's definition at ingest, one line each: a bound
    # (an outsized description or schema cut, upstream/listing.py) or a repair of a malformed
    # inputSchema (catalog/schemas.py). Shown in catalog_status, logged when the tool changes.
    problems: tuple[str, ...] = ()

    @classmethod
    def make(
        cls,
        server: str,
        tool: str,
        description: str | None,
        input_schema: dict[str, Any] | None,
        **extra: Any,
    ) -> "ToolRecord":
        desc = sys.intern(description or "")  # shared with the restored index's copy
        schema, repairs = repair_schema(input_schema or {"type": "object"})
        schema = intern_schema(schema)
        problems = (*extra.pop("problems", ()), *repairs)
        return cls(
            server=sys.intern(server),
            tool=sys.intern(tool),
            name=sys.intern(namespaced(server, tool)),
            description=desc,
            input_schema=schema,
            content_hash=schema_hash(tool, desc, schema),
            problems=problems,
            **extra,
        )

