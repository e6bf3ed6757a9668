"""Repair of malformed upstream inputSchemas (#15 item 7).

One broken tool must never take its upstream out of search and calls. A schema is checked
against the JSON Schema meta-schema when a record is made; each part the meta-schema rejects
(`"enum": 5`, an object `enum`, `items.enum: true`, `"required": "x"`, ...) is removed, and
the record says what was removed and why, so `catalog_status` and the log can name it.

Fast path: fastjsonschema compiled from the draft-07 meta-schema (~10 us a schema). Only a
schema it rejects goes to jsonschema (the schema's own draft, 2020-12 by default), which
reports every problem with its path. The meta-schemas are bundled: nothing is fetched.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import weakref
from typing import Any

import fastjsonschema
import jsonschema
import jsonschema.validators
import msgspec

_FAST = fastjsonschema.compile(jsonschema.Draft7Validator.META_SCHEMA, use_default=False)
_MAX_PASSES = 5  # removing a part can expose no new problem in practice; bounded anyway
_MAX_PROBLEMS = 10
_EMPTY: dict[str, Any] = {"type": "object"}


def _path(parts: list[str | int]) -> str:
    return "/".join(str(p) for p in parts) or "(root)"


def repair_schema(schema: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`schema` with every meta-schema violation removed, and one line per removal.

    A valid schema comes back as the same object with no problems."""
    if not isinstance(schema, dict):
        return dict(_EMPTY), (f"inputSchema is a {type(schema).__name__}, not an object: replaced by "
                              '{"type": "object"}',)
    try:
        _FAST(schema)
        return schema, ()
    except fastjsonschema.JsonSchemaException:
        pass
    except RecursionError:
        return schema, ()  # too deep for the fast check; validation handles depth on its own
    fixed = copy.deepcopy(schema)
    problems: list[str] = []
    cls = jsonschema.validators.validator_for(fixed, default=jsonschema.Draft202012Validator)
    meta = cls(cls.META_SCHEMA)
    for _ in range(_MAX_PASSES):
        errors = sorted(meta.iter_errors(fixed), key=lambda e: len(e.absolute_path), reverse=True)
        if not errors:
            break
        for err in errors:
            path = list(err.absolute_path)
            while path and isinstance(path[-1], int):
                path.pop()  # a bad item of a list: the whole list goes (indices would shift)
            if not path:
                return dict(_EMPTY), (*problems, f"inputSchema is not a valid schema ({err.message[:120]}): "
                                                 'replaced by {"type": "object"}')
            parent: Any = fixed
            for part in path[:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else (
                    parent[part] if isinstance(parent, list) and isinstance(part, int) and part < len(parent) else None)
            if not isinstance(parent, dict) or path[-1] not in parent:
                continue  # already gone with an enclosing part
            del parent[path[-1]]
            if len(problems) < _MAX_PROBLEMS:
                problems.append(f"removed {_path(path)}: {err.message[:120]}")
    return fixed, tuple(problems)


class Schema(dict[str, Any]):
    """An inputSchema as the catalog keeps it: one shared object per distinct schema
    (`intern_schema`), so read-only by contract (sanitizing and repairs copy, never write)."""

    __slots__ = ("__weakref__",)


# Distinct schemas by the digest of their canonical JSON. Weak: a schema no record or
# document holds any more leaves the pool with its last holder.
_POOL: weakref.WeakValueDictionary[bytes, Schema] = weakref.WeakValueDictionary()
_POOL_LOCK = threading.Lock()
_CANON = msgspec.json.Encoder(order="sorted")


def intern_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The pool's object for a schema equal to `schema` (its key order kept as first seen),
    added if new. Tools of one upstream often share a schema (no arguments, one `query`
    string, a common options block), and a restored index snapshot and the first listing
    after it hold the same schemas twice over: one copy each. A schema that cannot be
    encoded as JSON is returned as it is."""
    if type(schema) is Schema:
        return schema
    try:
        key = hashlib.blake2b(_CANON.encode(schema), digest_size=20).digest()
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
        return schema
    with _POOL_LOCK:
        got = _POOL.get(key)
        if got is None:
            got = _POOL[key] = Schema(schema)
    return got


def pooled_schemas() -> int:
    """How many distinct schemas the pool holds (for tests and status)."""
    return len(_POOL)


__all__ = ["Schema", "intern_schema", "pooled_schemas", "repair_schema"]
