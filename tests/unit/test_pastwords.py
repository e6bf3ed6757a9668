"""pastwords.PastWords: a principal's lexical index of past queries, built from sums over all
principals plus its own words, is the index the per-document construction builds (the one
learned.py used before), to the last bit of every score and ceiling."""

from __future__ import annotations

import random

import numpy as np
import pytest

from toolatlas.retrieval.bm25 import Bm25Index
from toolatlas.retrieval.learned import MIN_PRINCIPALS, OTHER_WORD_CAP
from toolatlas.retrieval.pastwords import PastWords


def reference(per_tool: list[dict[int, dict[str, int]]], own: int) -> Bm25Index:
    """The documents spelled out word by word, as learned.LearnedState.lexical built them."""
    docs: list[list[str]] = []
    for per in per_tool:
        others: dict[str, int] = {}
        tf: dict[str, int] = {}
        for p, ws in per.items():
            if p != own:
                for w, c in ws.items():
                    others[w] = others.get(w, 0) + 1
                    tf[w] = tf.get(w, 0) + min(c, OTHER_WORD_CAP)
        doc = [w for w, n in others.items() if n >= MIN_PRINCIPALS for _ in range(tf[w])]
        for w, n in per.get(own, {}).items():
            doc.extend([w] * n)
        docs.append(sorted(doc))
    return Bm25Index(docs)


def _catalog(seed: int, tools: int, principals: int, vocab: int) -> list[dict[int, dict[str, int]]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    out: list[dict[int, dict[str, int]]] = []
    for _ in range(tools):
        per: dict[int, dict[str, int]] = {}
        for p in rng.sample(range(principals), rng.randint(0, principals)):
            per[p] = {w: rng.choice([1, 1, 2, 3, 4, 7]) for w in rng.sample(words, rng.randint(1, 6))}
        out.append(per)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_every_principals_index_scores_as_the_spelled_out_documents(seed: int) -> None:
    per_tool = _catalog(seed, tools=40, principals=6, vocab=30)
    past = PastWords(per_tool, cap=OTHER_WORD_CAP, min_principals=MIN_PRINCIPALS)
    rng = random.Random(seed)
    queries = [[f"w{rng.randrange(34)}" for _ in range(rng.randint(1, 5))] for _ in range(40)]  # w30..: unknown
    for own in [-1, *range(7)]:  # 6: a principal with no events
        want, got = reference(per_tool, own), past.index(own)
        assert got.n_docs == want.n_docs and set(got.vocab) == set(want.vocab)
        for q in queries:
            assert np.array_equal(got.scores(q), want.scores(q)), (own, q)
            assert got.ceiling(q) == want.ceiling(q), (own, q)


def test_no_past_words_give_an_index_that_matches_nothing() -> None:
    past = PastWords([{}, {}], cap=OTHER_WORD_CAP, min_principals=MIN_PRINCIPALS)
    idx = past.index(-1)
    assert idx.n_docs == 2 and not idx.scores(["anything"]).any()
    assert idx.ceiling(["anything"]) == reference([{}, {}], -1).ceiling(["anything"])
