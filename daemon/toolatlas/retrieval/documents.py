"""What the engine indexes: a tool as a `ToolDoc`, and its `Entry` (the texts both branches
see, the embedding-cache key, the hnsw label).

Pure and small, below everything else in retrieval/: the index, the rankers, the on-disk
store and the facade all speak these types, and none of them imports another to get them.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

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


class Vocab:
    """BM25 term ids: token -> id, for the entries of one index builder (and the snapshots
    built from them). An entry keeps its field-weighted tokens as one `bytes` of uint32 ids,
    4 bytes a token where a tuple held an 8-byte pointer, and a snapshot's BM25 reads them
    with one `np.frombuffer` where it made a dict lookup and an int object per token. 100,000
    bench tools (2.8 million tokens): their entries 43.7 -> 32.7 MB, a snapshot build (every
    catalog change) 0.56-0.72 -> 0.29-0.32 s (bench/README.md, "Stop 40").

    Ids are only added, never reused, so a built index stays valid while later entries add
    terms (it ignores ids from its own length up). `IndexBuilder` starts a new vocabulary
    when most ids belong to tokens no entry has any more."""

    __slots__ = ("ids", "words", "_lock")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.words: list[str] = []  # id -> token
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Iterable[str]) -> bytes:
        """The ids of `tokens`, in order, as uint32 bytes; new tokens get the next ids."""
        ids, words = self.ids, self.words
        out: list[int] = []
        with self._lock:
            for t in tokens:
                i = ids.get(t)
                if i is None:
                    i = len(words)
                    words.append(t)  # before the id is visible: a reader of `ids` may index `words`
                    ids[t] = i
                out.append(i)
        return np.array(out, dtype=np.uint32).tobytes()

    def decode(self, terms: bytes) -> list[str]:
        words = self.words
        return [words[i] for i in np.frombuffer(terms, dtype=np.uint32).tolist()]


@dataclass(frozen=True, eq=False, slots=True)
class Entry:
    """A ToolDoc with what indexing it needs; `label` is set once its vector is in hnswlib."""

    doc: ToolDoc
    key: bytes  # sha256 of `text`: the embedding cache key
    terms: bytes  # field-weighted BM25 tokens, as uint32 ids of `vocab`
    vocab: Vocab
    label: int = -1  # hnsw label, -1 if not in the dense index

    @property
    def text(self) -> str:
        """What the embedder sees. Made again when asked, not kept: it is needed only until
        the document's vector exists (an estimated ~70 MB of text at 100,000 tools)."""
        return doc_text(self.doc)

    @property
    def tokens(self) -> list[str]:
        """The field-weighted BM25 tokens (made again from `terms`)."""
        return self.vocab.decode(self.terms)


def doc_text(doc: ToolDoc) -> str:
    """What the embedder sees of `doc`."""
    return dense_text(doc.tool, doc.server, doc.description, doc.input_schema, doc.server_summary, doc.tags)


def doc_key(doc: ToolDoc) -> bytes:
    """The embedding cache key of `doc`: sha256 of its `doc_text`."""
    return hashlib.sha256(doc_text(doc).encode()).digest()


def lexical_tokens(doc: ToolDoc) -> list[str]:
    """`doc`'s BM25 tokens, each field's repeated by its FIELD_WEIGHTS."""
    fields = lexical_fields(doc.tool, doc.server, doc.description, doc.input_schema, doc.server_summary, doc.tags)
    tokens: list[str] = []
    for fname, toks in fields.items():
        tokens.extend(toks * FIELD_WEIGHTS.get(fname, 1))
    return tokens


def make_entry(doc: ToolDoc, vocab: Vocab) -> Entry:
    """The index entry of `doc` (not yet in the dense index), its terms in `vocab`."""
    return Entry(doc=doc, key=doc_key(doc), terms=vocab.encode(lexical_tokens(doc)), vocab=vocab)


def in_vocab(entry: Entry, vocab: Vocab) -> Entry:
    """`entry` with its terms as ids of `vocab` (itself if they are already)."""
    if entry.vocab is vocab:
        return entry
    return Entry(doc=entry.doc, key=entry.key, terms=vocab.encode(entry.tokens), vocab=vocab, label=entry.label)
