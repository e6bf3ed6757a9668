"""What the engine indexes: a tool as a `ToolDoc`, and its `Entry` (the texts both branches
see, the embedding-cache key, the hnsw label).

Pure and small, below everything else in retrieval/: the index, the rankers, the on-disk
store and the facade all speak these types, and none of them imports another to get them.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from typing import Any

import msgspec

from toolatlas.retrieval.text import dense_text, lexical_fields

# BM25 field weights (token repeats per field), tuned on toollens/queries-train.jsonl only
# (see bench/eval_report.py).
FIELD_WEIGHTS: dict[str, int] = {
    "name": 1,
    "server": 1,
    "description": 1,
    "params": 1,
    "param_desc": 1,
    "summary": 1,
}


class ToolDoc(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as the engine ranks it; `name` (namespaced "server__tool") is the key."""

    name: str
    server: str
    tool: str
    description: str
    input_schema: dict[str, Any]
    server_summary: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False, slots=True)
class Entry:
    """A ToolDoc with what indexing it needs; `label` is set once its vector is in hnswlib."""

    doc: ToolDoc
    key: bytes  # sha256 of `text`: the embedding cache key
    tokens: tuple[str, ...]  # field-weighted BM25 tokens (a tuple: no list over-allocation, 100,000 of them)
    label: int = -1  # hnsw label, -1 if not in the dense index

    @property
    def text(self) -> str:
        """What the embedder sees. Made again when asked, not kept: it is needed only until
        the document's vector exists (an estimated ~70 MB of text at 100,000 tools)."""
        d = self.doc
        return dense_text(d.tool, d.server, d.description, d.input_schema, d.server_summary, d.tags)


def make_entry(doc: ToolDoc) -> Entry:
    """The index entry of `doc` (not yet in the dense index)."""
    args = (doc.tool, doc.server, doc.description, doc.input_schema, doc.server_summary, doc.tags)
    text = dense_text(*args)
    fields = lexical_fields(*args)
    tokens: list[str] = []
    for fname, toks in fields.items():
        # interned: a catalog's vocabulary is a few thousand words, its tokens millions
        # (100,000 tools held ~60 token strings each, one object per occurrence)
        tokens.extend([sys.intern(t) for t in toks] * FIELD_WEIGHTS.get(fname, 1))
    return Entry(doc=doc, key=hashlib.sha256(text.encode()).digest(), tokens=tuple(tokens))
