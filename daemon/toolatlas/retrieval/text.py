"""Tokenization and tool documents.

A query naming a tool must find it, so identifiers are split the way people read them:
``get_weatherForecast`` -> ``get weather forecast``; ``/v1/nutrition`` -> ``v1 nutrition``.
Lexical tokens are lower-cased, stop words dropped and lightly stemmed (plural and a few
verb suffixes) so "files"/"file" and "searching"/"search" meet.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

_CAMEL1 = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL2 = re.compile(r"([A-Z]+)([A-Z][a-z])")
_WORD = re.compile(r"[a-z0-9]+")
# An identifier written in a description (snake_case or camelCase): in a parameter's
# description it names another tool or field ("the id returned by add_note"), not what this
# tool does, so it is left out of the lexical document (the dense text keeps it).
_IDENT = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b|\b[a-z]+[A-Z][A-Za-z0-9]*\b")

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves i'm im i'd id want need please using use via also get""".split()
)


def split_identifier(text: str) -> str:
    """Insert spaces at camelCase humps; snake_case and punctuation are split by `words`."""
    return _CAMEL1.sub(r"\1 \2", _CAMEL2.sub(r"\1 \2", text))


def words(text: str) -> list[str]:
    """Lower-case alphanumeric words after camelCase/snake_case/punctuation splitting."""
    return _WORD.findall(split_identifier(text).lower())


def stem(word: str) -> str:
    """Plural stripping only (files -> file, queries -> query, but news, status, class stay).

    Heavier suffix stripping (-ed, -ing) conflated unrelated words on the training queries
    ("united" -> "unit", "news" -> "new") and did not pay for itself.
    """
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is", "ws", "os")):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Lexical tokens of `text`: split, lower-cased, stop words dropped, stemmed."""
    return [stem(w) for w in words(text) if w not in STOPWORDS]


def normalise_query(query: str) -> str:
    """The cache key form of a query: lower-case words separated by single spaces.

    Queries up to `_MEMO_CHARS` long are remembered (a repeated query is what the result
    cache answers, and splitting it again was a tenth of a cache hit's time in the daemon)."""
    return (_normalise_memo if len(query) <= _MEMO_CHARS else _normalise)(query)


def _normalise(query: str) -> str:
    return " ".join(words(query))


_MEMO_CHARS = 512
_normalise_memo = functools.lru_cache(maxsize=4096)(_normalise)


def _enum_values(schema: dict[str, Any]) -> list[Any]:
    values = schema.get("enum")
    return values if isinstance(values, list) else []


def _param_lines(schema: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterable[tuple[str, str, str, str]]:
    """(name, type, description, enum values) for every property, nested objects flattened."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or depth > 3:
        return
    for pname, pschema in props.items():
        if not isinstance(pschema, dict):
            continue
        full = f"{prefix}{pname}"
        ptype = pschema.get("type", "")
        if isinstance(ptype, list):
            ptype = " ".join(str(t) for t in ptype)
        desc = pschema.get("description", "")
        # Upstream schemas are untrusted JSON: an `enum` that is not a list (5, an object,
        # true) is not JSON Schema; it is left out of the document, never a crash that would
        # take the upstream's whole catalog out of the index.
        enum = _enum_values(pschema)
        items = pschema.get("items")
        if isinstance(items, dict) and not enum:
            enum = _enum_values(items)
        yield full, str(ptype), str(desc) if isinstance(desc, str) else "", " ".join(str(e) for e in enum[:20])
        if isinstance(items, dict) and items.get("properties"):
            yield from _param_lines(items, f"{full} ", depth + 1)
        if pschema.get("properties"):
            yield from _param_lines(pschema, f"{full} ", depth + 1)


def dense_text(
    tool: str, server: str, description: str, input_schema: dict[str, Any], server_summary: str = "",
    tags: Iterable[str] = (),
) -> str:
    """The structured document the embedder sees (truncated at the model's 256 tokens)."""
    name_words = " ".join(words(tool))
    head = f"{name_words} ({' '.join(words(server))})"
    parts = [head + (f": {description.strip()}" if description.strip() else "")]
    params = []
    for pname, ptype, pdesc, enum in _param_lines(input_schema):
        item = " ".join(words(pname))
        if pdesc:
            item += f": {pdesc.strip()}"
        if enum:
            item += f" (one of {enum})"
        params.append(item)
    if params:
        parts.append("Parameters: " + "; ".join(params) + ".")
    if server_summary.strip():
        parts.append(f"Server: {server_summary.strip()}")
    tags = list(tags)
    if tags:
        parts.append("Tags: " + ", ".join(tags))
    return " ".join(parts)


def lexical_fields(
    tool: str, server: str, description: str, input_schema: dict[str, Any], server_summary: str = "",
    tags: Iterable[str] = (),
) -> dict[str, list[str]]:
    """Tokens per field; the BM25 builder weights fields by repetition."""
    params: list[str] = []
    pdescs: list[str] = []
    for pname, ptype, pdesc, enum in _param_lines(input_schema):
        params.extend(tokenize(pname))
        pdescs.extend(tokenize(f"{_IDENT.sub(' ', pdesc)} {enum}"))
    return {
        "name": tokenize(tool),
        "server": tokenize(server),
        "description": tokenize(description),
        "params": params,
        "param_desc": pdescs,
        "summary": tokenize(server_summary) + tokenize(" ".join(tags)),
    }
