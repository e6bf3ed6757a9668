"""Replaying feedback into a fresh learned state: `toolatlas eval --feedback FILE`, the
learning benchmark and the tests all go through here, into the same `LearningIndex` and
ranker (`Engine.search(mode="learned")`) the daemon uses.

A feedback file is in queries.jsonl format: each line's relevant tools count as executed
after that query (one usage event each), by the line's `"principal"` when it has one and
otherwise by the evaluating user (`EVAL_PRINCIPAL`, whose own events count in full).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from toolatlas.evaluation.datasets import Query
from toolatlas.retrieval.engine import Engine, query_vectors
from toolatlas.retrieval.learned import LearnedState, LearningIndex
from toolatlas.retrieval.usage import UsageEvent

EVAL_PRINCIPAL = "eval"  # who `toolatlas eval` searches as
_BATCH = 256


def feedback_events(
    queries: Sequence[Query], vectors: np.ndarray | None, space: str | None, *, at: float = 0.0,
    known: frozenset[str] | None = None,
) -> list[UsageEvent]:
    """One event per (query, relevant tool), with the query's vector (row of `vectors`);
    tools outside `known` (None: all) are left out."""
    out: list[UsageEvent] = []
    for i, q in enumerate(queries):
        vec = vectors[i] if vectors is not None else None
        for tool in sorted(q.relevant):
            if known is None or tool in known:
                out.append(UsageEvent(query=q.text, tool=tool, principal=q.principal or EVAL_PRINCIPAL, at=at,
                                      vector=vec, space=space if vec is not None else None))
    return out


def embed_queries(engine: Engine, queries: Sequence[Query]) -> np.ndarray | None:
    """The queries' vectors from the engine's query embedder (None without one)."""
    if engine.embedder is None or not queries:
        return None
    parts = []
    for s in range(0, len(queries), _BATCH):
        vecs = query_vectors(engine, [q.text for q in queries[s : s + _BATCH]])
        if vecs is None:
            return None
        parts.append(vecs)
    return np.concatenate(parts)


def replay(engine: Engine, feedback: Sequence[Query], vectors: np.ndarray | None = None, *,
           known: frozenset[str] | None = None) -> LearnedState:
    """A fresh learned state of `feedback` (vectors computed unless given), published to
    `engine` (its "learned" mode then ranks with it) and returned; events of tools outside
    `known` (None: all) are left out."""
    if vectors is None:
        vectors = embed_queries(engine, feedback)
    idx = LearningIndex()
    idx.add(feedback_events(feedback, vectors, engine.space, known=known))
    state = idx.state(0.0)
    engine.set_learned(state)
    return state


__all__ = ["EVAL_PRINCIPAL", "embed_queries", "feedback_events", "replay"]
