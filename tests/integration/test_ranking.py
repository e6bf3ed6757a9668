"""The default ranker's contract (issue 17 item 5): scores and order independent of top_k,
and the obvious tool first for obvious queries on the bundled example servers (a small
labelled set, tests/data/example_queries.jsonl, over the servers' real listings)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from tests.support.configs import make_upstream
from tests.support.servers import example_args
from toolatlas.evaluation import metrics
from toolatlas.evaluation.datasets import benchdata_dir, load_catalog
from toolatlas.gateway.view import documents
from toolatlas.catalog.attest import AttestResult
from toolatlas.catalog.catalog_file import read_json_lines
from toolatlas.retrieval import rank as rank_mod
from toolatlas.retrieval.engine import Engine, ToolDoc

EXAMPLE_QUERIES = Path(__file__).resolve().parents[1] / "data" / "example_queries.jsonl"
QUERIES = ["read the contents of a text file", "stock price of apple", "search the web for news", "click a button"]


@pytest.fixture(scope="module")
def mcp_docs() -> list[ToolDoc]:
    docs, _ = load_catalog(benchdata_dir() / "mcptoolbenchpp" / "catalog.jsonl")
    return docs


def _hits(eng: Engine, query: str, k: int, servers: list[str] | None = None) -> list[tuple[str, float]]:
    return [(h.name, h.score) for h in eng.search(query, k, servers=servers).hits]


@pytest.mark.parametrize("hnsw", [False, True])
def test_scores_and_order_do_not_depend_on_top_k(mcp_docs: list[ToolDoc], hnsw: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if hnsw:  # the large-catalog path: fixed candidate pools per branch
        monkeypatch.setattr(rank_mod, "HNSW_MIN", 0)
    eng = Engine(state_dir=None, cache_size=0)
    eng.load()
    eng.update(mcp_docs, [])
    scope = sorted({d.server for d in mcp_docs})[:3]
    for query in QUERIES:
        for servers in (None, scope):
            longest = _hits(eng, query, 20, servers)
            assert len(longest) >= 3
            for k in (1, 3, 5, 10):
                assert _hits(eng, query, k, servers) == longest[:k], (query, k, servers)


async def _example_docs() -> list[ToolDoc]:
    """The example servers' tools as the daemon indexes them (listed over stdio)."""
    from toolatlas.upstream.pool import list_tools_once

    docs: list[ToolDoc] = []
    for name in ("notes", "weather", "units"):
        up = make_upstream(name, "stdio", command=sys.executable, args=example_args(name))
        listing = await list_tools_once(up)
        texts = {t.tool: (t.description, "", ()) for t in listing}
        verdict = AttestResult(texts=texts, quarantined={}, card_status="unattested")
        docs.extend(documents(name, listing, verdict)[1].values())
    return docs


async def test_obvious_queries_find_the_obvious_example_tool() -> None:
    with anyio.fail_after(60):
        docs = await _example_docs()
    assert len(docs) == 13
    eng = Engine(state_dir=None, cache_size=0)
    eng.load()
    eng.update(docs, [])
    labelled = [(obj["query"], {f"{r['server']}__{r['name']}" for r in obj["relevant"]})
                for _, obj in read_json_lines(EXAMPLE_QUERIES)]
    assert len(labelled) == 20
    firsts = 0
    for query, relevant in labelled:
        ranked = [h.name for h in eng.search(query, 5).hits]
        assert metrics.recall_at(ranked, relevant, 3) == 1.0, (query, ranked)
        firsts += ranked[0] in relevant
    assert [h.name for h in eng.search("add a note", 1).hits] == ["notes__add_note"]
    # 13 of 20 first today (the rest second or third); a floor, so a regression shows
    assert firsts >= 13, firsts


def test_the_learned_ranker_with_no_events_is_the_zero_shot_ranker(mcp_docs: list[ToolDoc]) -> None:
    from toolatlas.evaluation.datasets import load_queries
    from toolatlas.retrieval.learned import empty_state

    docs, key_of = load_catalog(benchdata_dir() / "mcptoolbenchpp" / "catalog.jsonl")
    queries = load_queries(benchdata_dir() / "mcptoolbenchpp" / "queries.jsonl", key_of)[:60]
    eng = Engine(state_dir=None, cache_size=0)
    eng.load()
    eng.update(docs, [])
    for state in (None, empty_state()):
        eng.set_learned(state)
        for q in queries:
            zero = [(h.name, h.score) for h in eng.search(q.text, 10, mode="hybrid").hits]
            assert [(h.name, h.score) for h in eng.search(q.text, 10, mode="learned", principal="u").hits] == zero


async def test_far_queries_find_nothing_and_the_labelled_ones_always_something() -> None:
    from toolatlas.retrieval import adaptive

    with anyio.fail_after(60):
        docs = await _example_docs()
    eng = Engine(state_dir=None, cache_size=0)
    eng.load()
    eng.update(docs, [])
    # The floor is calibrated on ToolLens train, not here. The lowest of the 20 labelled queries
    # are "what is 17 times 23" and "save a reminder to call mum", and the CPU's int8 kernels
    # move them across the floor (0.154): best cosine 0.157 / 0.159 on the machine the floor was
    # set on, 0.166 / 0.143 on an AVX512-VNNI Xeon (fp32 queries there: 0.152 / 0.150). Within
    # NEAR_FLOOR of the floor a verdict either way is accepted; everywhere else it must be the
    # right one, and at most two labelled queries may abstain.
    NEAR_FLOOR = 0.02

    def near_floor(evidence: tuple[float, float]) -> bool:
        return abs(evidence[0] - adaptive.COS_FLOOR) < NEAR_FLOOR

    abstained, seen = [], {}
    for _, obj in read_json_lines(EXAMPLE_QUERIES):
        out = eng.search(obj["query"], 5)
        assert out.evidence is not None
        seen[obj["query"]] = out.evidence
        if adaptive.nothing_fits(*out.evidence):
            abstained.append(obj["query"])
    assert all(near_floor(seen[q]) for q in abstained), {q: seen[q] for q in abstained}
    assert len(abstained) <= 2
    far = ("book a flight to Rome", "order a pizza", "send an email to my boss", "play some jazz music",
           "translate this paragraph into Japanese")
    for query in far:
        out = eng.search(query, 5)
        assert out.evidence is not None
        assert adaptive.nothing_fits(*out.evidence) or near_floor(out.evidence), (query, out.evidence)
    assert sum(adaptive.nothing_fits(*eng.search(q, 5).evidence or (1.0, 1.0)) for q in far) >= 4
