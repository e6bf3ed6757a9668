"""BM25 over term ids (issue 19 item 3): entries keep their tokens as uint32 ids of the
builder's vocabulary, and a snapshot's BM25 built from those ids scores exactly as one
built from the tokens. Real IndexBuilder, real Bm25Index; no model."""

from __future__ import annotations

import numpy as np
import pytest

from toolatlas.retrieval import index
from toolatlas.retrieval.bm25 import Bm25Index
from toolatlas.retrieval.documents import ToolDoc, Vocab, make_entry
from toolatlas.retrieval.index import IndexBuilder, plan_update
from toolatlas.retrieval.text import tokenize

QUERIES = ("read a file", "weather forecast for a city", "send an email message", "unknownword file", "")


def _docs() -> list[ToolDoc]:
    rows = [
        ("fs", "read_file", "Read the contents of a file from disk"),
        ("fs", "write_file", "Write text to a file, creating it if needed"),
        ("weather", "get_forecast", "Weather forecast for a city, by day"),
        ("mail", "send_email", "Send an email message to a recipient"),
        ("mail", "list_messages", "List the messages of a mailbox folder"),
    ]
    return [ToolDoc(name=f"{s}__{t}", server=s, tool=t, description=d,
                    input_schema={"type": "object", "properties": {"path": {"type": "string", "description": "file path"}}})
            for s, t, d in rows]


def _builder() -> IndexBuilder:
    return IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})


def test_terms_score_exactly_as_tokens() -> None:
    vocab = Vocab()
    vocab.encode(["zebra", "quartz"])  # ids no document below uses
    entries = [make_entry(d, vocab) for d in _docs()]
    by_terms = Bm25Index.of_terms([e.terms for e in entries], vocab)
    by_tokens = Bm25Index([e.tokens for e in entries])
    assert [len(e.terms) for e in entries] == [4 * len(e.tokens) for e in entries]
    for q in (*QUERIES, "zebra file"):
        toks = tokenize(q)
        assert np.array_equal(by_terms.scores(toks), by_tokens.scores(toks)), q
        assert by_terms.ceiling(toks) == pytest.approx(by_tokens.ceiling(toks)), q
        for a, b in zip(by_terms.overlap(toks), by_tokens.overlap(toks)):
            assert np.array_equal(a, b), q
    assert by_terms.live_terms == by_tokens.live_terms == len(by_tokens.vocab)


def test_words_added_after_a_build_are_unknown_to_it() -> None:
    vocab = Vocab()
    entries = [make_entry(d, vocab) for d in _docs()]
    built = Bm25Index.of_terms([e.terms for e in entries], vocab)
    before = built.scores(tokenize("galaxy telescope file"))
    vocab.encode(["galaxy", "telescope"])  # a later entry's words
    assert np.array_equal(built.scores(tokenize("galaxy telescope file")), before)
    assert built.ceiling(["galaxy"]) == built.ceiling(["neverseen"]) == built.max_idf * (built.k1 + 1.0)


def test_the_builder_renews_a_vocabulary_mostly_of_dead_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "VOCAB_RENEW_MIN", 40)
    b = _builder()
    docs = _docs()
    b.entries, stale = plan_update({}, docs, [], b.vocab)
    first, _ = b.commit(b.entries, stale, 1, None)
    want = first.bm25.scores(tokenize("read a file"))
    churn = docs[0]
    vocabs = set()
    for i in range(60):  # one tool whose description gets new words at every listing
        churn = ToolDoc(name=churn.name, server=churn.server, tool=churn.tool,
                        description=f"Read the contents of a file, build w{i}x{i} r{i}q", input_schema=churn.input_schema)
        entries, stale = plan_update(b.entries, [churn], [], b.vocab)
        snap, _ = b.commit(entries, stale, i + 2, None)
        vocabs.add(id(b.vocab))
        assert len(b.vocab) <= 2 * 40 + 3  # renewed before it passes the bound by more than one change
        hits = snap.bm25.scores(tokenize(f"w{i}x{i} file"))
        assert int(np.argmax(hits)) == snap.pos_of[churn.name]
    assert len(vocabs) > 1  # it was renewed, more than once
    assert all(e.vocab is b.vocab for e in b.entries.values())
    # the first snapshot kept its own vocabulary: its scores did not move
    assert np.array_equal(first.bm25.scores(tokenize("read a file")), want)
    # and the renewed entries score as freshly made ones
    fresh = Vocab()
    again = Bm25Index.of_terms([make_entry(e.doc, fresh).terms for e in b.entries.values()], fresh)
    assert np.array_equal(snap.bm25.scores(tokenize("read the contents of a file")),
                          again.scores(tokenize("read the contents of a file")))
