"""Retrieval engine: tokenization, fusion math, scopes, cache, concurrency, persistence,
degradation. Uses the real packaged MiniLM (ONNX, exported once into the user cache dir) on
the 49-tool MCPToolBench++ catalog so the suite stays quick."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.daemon import shared_onnx_models
from tests.support.files import UNREADABLE, plant_unreadable
from toolatlas.evaluation.datasets import benchdata_dir, load_catalog, load_queries
from toolatlas.retrieval import rank as rank_mod
from toolatlas.retrieval import fusion
from toolatlas.retrieval.embed import (
    _EXPORT_DIRNAME,
    EmbedderUnavailable,
    ensure_onnx_export,
    get_embedder,
    models_dir,
)
from toolatlas.retrieval.engine import Engine, ToolDoc
from toolatlas.retrieval.text import dense_text, normalise_query, tokenize, words

MCP = benchdata_dir() / "mcptoolbenchpp"


# -- pure parts ---------------------------------------------------------------------------


def test_words_split_snake_camel_and_punctuation() -> None:
    assert words("get_weatherForecast") == ["get", "weather", "forecast"]
    assert words("HTTPServer.listTools") == ["http", "server", "list", "tools"]
    assert words("/v1/nutrition") == ["v1", "nutrition"]
    assert words("read-file  (v2)") == ["read", "file", "v2"]


def test_tokenize_drops_stopwords_and_strips_plurals_only() -> None:
    assert tokenize("Search the files for the queries") == ["search", "file", "query"]
    # "news" must not become "new", "status" must not become "statu"
    assert tokenize("latest news status class") == ["latest", "news", "status", "class"]
    assert tokenize("playwright_iframe_click") == ["playwright", "iframe", "click"]


def test_normalised_query_is_the_cache_form() -> None:
    assert normalise_query("  Read FILE!!  ") == normalise_query("read file")


def test_dense_text_carries_name_server_params_and_enums() -> None:
    text = dense_text(
        "search_issues",
        "github",
        "Find issues.",
        {"type": "object", "properties": {"state": {"type": "string", "enum": ["open", "closed"], "description": "Issue state"}}},
    )
    assert text.startswith("search issues (github): Find issues.")
    assert "state: Issue state (one of open closed)" in text


def test_rrf_math() -> None:
    fused = fusion.rrf([[1, 2, 3], [2, 4]], k=60)
    assert fused[2] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1] == pytest.approx(1 / 61)
    assert fused[4] == pytest.approx(1 / 62)
    assert max(fused, key=fused.__getitem__) == 2


def test_score_normalisation_and_weighted_fusion() -> None:
    lex = np.array([10.0, 0.0, 5.0], dtype=np.float32)
    den = np.array([0.2, 0.8, 0.5], dtype=np.float32)
    assert fusion.minmax(lex).tolist() == [1.0, 0.0, 0.5]
    z = fusion.zscore(den)
    assert z.mean() == pytest.approx(0.0, abs=1e-6) and z.std() == pytest.approx(1.0, rel=1e-5)
    assert fusion.zscore(np.ones(3)).tolist() == [0.0, 0.0, 0.0]
    mixed = fusion.weighted(lex, den, 0.5, "minmax")
    assert mixed.tolist() == pytest.approx([0.5, 0.5, 0.5])
    # all weight on one branch reproduces that branch's order
    assert np.argsort(-fusion.weighted(lex, den, 1.0)).tolist() == [1, 2, 0]
    assert np.argsort(-fusion.weighted(lex, den, 0.0)).tolist() == [0, 2, 1]


def test_top_indices_scoped_ties_and_positive() -> None:
    s = np.array([0.5, 0.9, 0.9, 0.0, 0.7], dtype=np.float32)
    assert fusion.top_indices(s, 2).tolist() == [1, 2]  # tie broken by position
    assert fusion.top_indices(s, 3, np.array([0, 3, 4])).tolist() == [4, 0, 3]
    assert fusion.top_indices(s, 10, positive=True).tolist() == [1, 2, 4, 0]
    assert fusion.top_indices(s, 0).tolist() == []


@pytest.mark.parametrize(
    ("k", "m", "n", "expected"),
    [
        (5, 6, 49, 2),  # n_bar 8.2: floor(10/8.2)+1 = 2
        (5, 10, 20, 6),  # n_bar 2: floor(5)+1 = 6
        (20, 10, 20, 10),  # capped at m
        (1, 100, 10000, 2),  # at least 2
        (5, 1, 3, 1),  # never more servers than exist
        (3, 0, 0, 0),
    ],
)
def test_two_stage_server_count(k: int, m: int, n: int, expected: int) -> None:
    assert fusion.two_stage_servers(k, m, n) == expected
    if m:
        assert expected == min(m, max(2, math.floor(2 * k / (n / m)) + 1))


# -- engine on the real model --------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_docs() -> list[ToolDoc]:
    docs, _ = load_catalog(MCP / "catalog.jsonl")
    return docs


@pytest.fixture(scope="module")
def shared_models() -> Path:
    """The suite's ONNX export (the subprocess imports torch, not us): the user cache's, under
    the suite's XDG_CACHE_HOME, where an engine with no state dir reads it."""
    models = shared_onnx_models()
    assert models == models_dir(None)
    return models


def _state_dir(tmp_path: Path, shared_models: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "models").symlink_to(shared_models, target_is_directory=True)
    return state


@pytest.fixture(scope="module")
def engine(mcp_docs: list[ToolDoc], shared_models: Path) -> Engine:
    eng = Engine(state_dir=None)
    eng.load()
    eng.update(mcp_docs, [])
    return eng


def test_onnx_vectors_are_normalised_and_int8_stays_close(shared_models: Path) -> None:
    onnx = get_embedder("onnx-fp32")
    texts = ["read a file from disk", "search the web for news about climate"]
    v = onnx.embed(texts)
    assert v.shape == (2, 384) and v.dtype == np.float32
    assert np.linalg.norm(v, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    # int8 (per-channel weight scales) stays close to fp32; the quality rule is checked with
    # `toolatlas eval`. One scale per tensor measured 0.93-0.96 on such texts.
    q = get_embedder("onnx-int8").embed(texts)
    assert (q * v).sum(axis=1).min() > 0.98


def test_the_export_fuses_each_layer_and_matches_the_unfused_graph(shared_models: Path) -> None:
    folder = shared_models / _EXPORT_DIRNAME
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == 2
    fusion = manifest["fusion"]
    assert fusion["fused"] is True, fusion
    assert fusion["operators"]["Attention"] == 6 and fusion["operators"]["SkipLayerNormalization"] == 12
    assert fusion["max_abs_diff"] <= 1e-4
    import onnx

    ops = {n.op_type for n in onnx.load(str(folder / "model.int8.onnx"), load_external_data=False).graph.node}
    assert "QAttention" in ops and "Softmax" not in ops  # attention fused, then quantized


def test_default_embedder_fp32_documents_int8_queries_and_releases_the_document_model(shared_models: Path) -> None:
    from toolatlas.retrieval.embed import OnnxEmbedder

    texts = ["read a file from disk", "search the web for news about climate"]
    fp32 = get_embedder("onnx-fp32")
    default = get_embedder("onnx")
    assert (default.name, default.query_name) == ("all-MiniLM-L6-v2/onnx-fp32", "all-MiniLM-L6-v2/onnx-int8")
    # documents: the fp32 (torch) vectors exactly; queries: int8, the same space
    np.testing.assert_allclose(default.embed(texts), fp32.embed(texts), atol=1e-5)
    np.testing.assert_allclose(default.embed_queries(texts), get_embedder("onnx-int8").embed_queries(texts), atol=1e-5)
    assert (default.embed_queries(texts) * fp32.embed(texts)).sum(axis=1).min() > 0.9
    # the document model loads on first use and is released once idle
    emb = OnnxEmbedder(shared_models / _EXPORT_DIRNAME, "fp32", "int8", doc_idle_s=0.2)
    emb.embed_queries(texts)
    assert not emb.doc_model_loaded and emb.doc_model_loads == 0
    emb.embed(texts)
    assert emb.doc_model_loaded and emb.doc_model_loads == 1
    deadline = time.monotonic() + 10
    while emb.doc_model_loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not emb.doc_model_loaded
    np.testing.assert_allclose(emb.embed(texts), fp32.embed(texts), atol=1e-5)
    assert emb.doc_model_loads == 2


def test_a_lone_query_spins_two_threads_and_concurrent_recent_or_batched_queries_take_one(shared_models: Path) -> None:
    import threading

    from toolatlas.retrieval.embed import LONE_WINDOW, OnnxEmbedder, usable_cores

    folder = shared_models / _EXPORT_DIRNAME
    single = OnnxEmbedder(folder, "fp32", "int8", query_threads=1)
    assert single.query_threads == 1
    single.embed_queries(["read a file"])
    assert single.lone_queries == 0
    if usable_cores() < 2:
        pytest.skip("one usable core: no second thread to spin")
    emb = OnnxEmbedder(folder, "fp32", "int8", query_threads=2)
    assert emb.query_threads == 2
    emb.cores_idle = lambda extra: True  # this test is about the searches; the host's load is the next one's
    q = "read a file from disk"
    lone = emb.embed_queries([q])
    assert emb.lone_queries == 1
    # the same vector as on one thread; a batch (Rift, eval) never takes the spinning session
    np.testing.assert_allclose(lone, single.embed_queries([q]), atol=1e-5)
    emb.embed_queries([q, "search the web"])
    assert emb.lone_queries == 1
    # while another call is in flight, a query runs on one thread: a batch of long texts
    # (~1 s of CPU at first), doubled while it ends before the query does (bounded)
    for size in (16, 32, 64, 128, 256):
        long_texts = [" ".join(f"word{i}{j}" for j in range(120)) for i in range(size)]
        worker = threading.Thread(target=emb.embed_queries, args=(long_texts,))
        worker.start()
        deadline = time.monotonic() + 10
        while emb._in_flight == 0 and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        spun = emb.lone_queries
        emb.embed_queries([q])
        still_in_flight = emb._in_flight == 1
        worker.join(240)  # 256 long texts: about a minute on two cores beside a full suite
        assert not worker.is_alive(), "the batch did not finish within 240 s"
        if still_in_flight:
            break
    assert still_in_flight, "every batch finished before the second query"
    assert emb.lone_queries == spun and emb._in_flight == 0
    # a finished batch says nothing about later searches: the next query spins again
    emb.embed_queries([q])
    assert emb.lone_queries == spun + 1
    # two searches in flight at once: neither spins, nor do the next LONE_WINDOW searches
    long_query = " ".join(f"token{j}" for j in range(400))  # truncated at 256 tokens
    for _attempt in range(20):  # bounded: a try fails only if the first query ends too soon
        first = threading.Thread(target=emb.embed_queries, args=([long_query],))
        before = emb.lone_queries
        first.start()
        deadline = time.monotonic() + 10
        while emb._singles_in_flight == 0 and first.is_alive() and time.monotonic() < deadline:
            time.sleep(0.0002)
        emb.embed_queries([q])
        first.join(60)
        if any(emb._recent):
            break
    assert any(emb._recent), "never caught two searches in flight at once"
    assert emb.lone_queries <= before + 1  # the second search did not spin
    for _ in range(LONE_WINDOW - 1):
        emb.embed_queries([q])
    assert emb.lone_queries <= before + 1
    for _ in range(LONE_WINDOW):
        emb.embed_queries([q])
    assert emb.lone_queries > before + 1


def test_a_query_naming_a_tool_finds_it(engine: Engine) -> None:
    for mode in ("hybrid", "bm25", "keyword", "two-stage"):
        out = engine.search("playwright_iframe_click", 3, mode=mode)
        assert out.hits[0].name == "playwright__playwright_iframe_click", mode
        assert out.mode == mode and out.degraded is None


def test_hybrid_ranks_by_meaning(engine: Engine) -> None:
    out = engine.search("what is the share price of Apple right now", 5)
    assert out.hits and out.hits[0].server == "finance-agent-mcp-server"
    assert [h.score for h in out.hits] == sorted((h.score for h in out.hits), reverse=True)


@pytest.mark.parametrize("mode", ["hybrid", "dense", "bm25", "two-stage"])
def test_narrow_scope_still_returns_top_k_from_the_allowed_set(engine: Engine, mode: str) -> None:
    # A web-search query, restricted to the filesystem server: the caller still gets 5 results,
    # all from the allowed server (not the empty remainder of a global top 5).
    query = "list the files in the project directory and search the web for news"
    unscoped = engine.search(query, 5, mode=mode)
    scoped = engine.search(query, 5, servers=["filesystem"], mode=mode)
    assert {h.server for h in scoped.hits} == {"filesystem"}
    assert len(scoped.hits) == 5
    if mode != "bm25":
        assert {h.server for h in unscoped.hits} != {"filesystem"}
    assert engine.search(query, 5, servers=["no-such-server"], mode=mode).hits == []
    assert engine.search(query, 5, servers=[], mode=mode).hits == []


def test_scopes_on_the_hnsw_paths(mcp_docs: list[ToolDoc], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_mod, "HNSW_MIN", 0)  # route even 49 docs through hnswlib
    eng = Engine(state_dir=None, cache_size=0)
    eng.load()
    eng.update(mcp_docs, [])
    servers = sorted({d.server for d in mcp_docs})
    wide = [s for s in servers if s != "filesystem"]  # most of the catalog: hnsw + filter
    n_wide = sum(1 for d in mcp_docs if d.server in wide)
    for scope, expect in ((None, 10), (wide, min(10, n_wide)), (["google-search"], 1)):
        out = eng.search("read the contents of a text file", 10, servers=scope, mode="dense")
        assert len(out.hits) == expect
        if scope is not None:
            assert {h.server for h in out.hits} <= set(scope)
    # every server (what the gateway passes for a caller allowed everything): the unscoped
    # path, with no position list and no per-label filter held for it
    unscoped = eng.search("read the contents of a text file", 10, mode="dense")
    everything = eng.search("read the contents of a text file", 10, servers=[*servers, "not-listed"], mode="dense")
    assert everything.hits == unscoped.hits
    assert eng._snap is not None and eng._snap.scope_cache.keys() == {("google-search",), tuple(wide)}
    assert eng.stats()["dense_index"]["live"] == len(mcp_docs)


def test_cache_hits_and_invalidation_on_update(mcp_docs: list[ToolDoc]) -> None:
    eng = Engine(state_dir=None)
    eng.load()
    v1 = eng.update(mcp_docs, [])
    assert eng.cached("Take a screenshot of the page", 5) is None  # a peek: not counted as a miss
    first = eng.search("Take a screenshot of the page", 5)
    again = eng.search("take a SCREENSHOT of the page!", 5)  # same normalised query
    assert not first.cached and again.cached and again.hits == first.hits
    peek = eng.cached("take a screenshot of the page", 5, servers=None)
    assert peek is not None and peek.cached and peek.hits == first.hits
    assert eng.cached("take a screenshot of the page", 5, servers=["playwright"]) is None  # scope is in the key
    assert eng.search("take a screenshot of the page", 3).cached is False  # top_k is in the key
    assert eng.search("take a screenshot of the page", 5, servers=["playwright"]).cached is False
    new = ToolDoc(
        name="camera__snap_screenshot",
        server="camera",
        tool="snap_screenshot",
        description="Take a screenshot of the page and save it as a PNG image.",
        input_schema={"type": "object", "properties": {}},
    )
    v2 = eng.update([new], [])
    assert v2 == v1 + 1 == eng.version
    after = eng.search("take a screenshot of the page", 5)
    assert not after.cached and after.version == v2
    assert "camera__snap_screenshot" in [h.name for h in after.hits]
    assert eng.cached("take a screenshot of the page", 3) is None  # the update invalidated it
    st = eng.stats()
    assert st["cache"]["hits"] == 2 and st["cache"]["misses"] == 4
    json.dumps(st)


def test_cache_ttl_expires(mcp_docs: list[ToolDoc]) -> None:
    now = [0.0]
    eng = Engine(state_dir=None, cache_ttl=10.0)
    eng._cache._clock = lambda: now[0]  # noqa: SLF001 - a controllable clock, not a mock of the engine
    eng.load()
    eng.update(mcp_docs[:10], [])
    assert not eng.search("close the browser", 5).cached
    now[0] = 9.0
    assert eng.search("close the browser", 5).cached
    now[0] = 20.0
    assert not eng.search("close the browser", 5).cached


def test_the_caches_hold_a_long_query_by_its_digest_not_its_text(mcp_docs: list[ToolDoc], shared_models: Path) -> None:
    """A query may be megabytes long (up to max_message_bytes): the result cache and the
    query-vector cache keep it as a digest, so distinct long queries do not pile up their
    text in the daemon (they held about 2 bytes a query character, up to 1,024 entries: 6 MB
    for three 1 MB queries), and a repeated long query is still answered from the cache."""
    import gc
    import tracemalloc

    eng = Engine(state_dir=None)
    eng.load()
    eng.update(mcp_docs[:20], [])
    eng.search("warm up the query path", 5)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(3):
            query = f"query {i} " + "take a screenshot of the page " * 35_000  # about 1 MB
            first = eng.search(query, 5)
            assert first.hits and not first.cached and first.mode == "hybrid"
            assert eng.search(query, 5).cached
        del query, first
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert eng.stats()["cache"]["size"] == 4
    assert held < 1_000_000, f"3 distinct 1 MB queries left {held} bytes in the engine's caches"


def test_update_replaces_and_removes(mcp_docs: list[ToolDoc]) -> None:
    eng = Engine(state_dir=None, cache_size=0)
    eng.load()
    eng.update(mcp_docs, [])
    target = next(d for d in mcp_docs if d.tool == "tavily-crawl")
    changed = ToolDoc(**{**{f: getattr(target, f) for f in target.__struct_fields__}, "description": "Order a pizza for delivery."})
    eng.update([changed], ["google-search__search"])
    assert len(eng) == len(mcp_docs) - 1
    assert eng.search("order a pizza", 1).hits[0].name == target.name
    assert all(h.name != "google-search__search" for h in eng.search("perform a web search query", 10).hits)
    st = eng.stats()
    assert st["dense_index"]["live"] == len(mcp_docs) - 1
    assert st["embeddings_computed"] == len(mcp_docs) + 1 or st["embeddings_cached"] > 0


def test_search_during_updates_never_misses_a_stable_doc(mcp_docs: list[ToolDoc], monkeypatch: pytest.MonkeyPatch) -> None:
    """Insert-before-delete: docs replaced over and over stay findable at every instant."""
    monkeypatch.setattr(rank_mod, "HNSW_MIN", 0)  # exercise the shared hnswlib index
    eng = Engine(state_dir=None, cache_size=0)
    eng.load()
    eng.update(mcp_docs, [])
    churn = [d for d in mcp_docs if d.server == "filesystem"]
    stop = threading.Event()
    errors: list[BaseException] = []
    rounds = [0]

    def updater() -> None:
        try:
            i = 0
            while not stop.is_set() and i < 6:
                i += 1
                docs = [
                    ToolDoc(**{**{f: getattr(d, f) for f in d.__struct_fields__}, "description": f"{d.description} (rev {i})"})
                    for d in churn
                ]
                eng.update(docs, [])
                rounds[0] = i
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    t = threading.Thread(target=updater)
    t.start()
    seen_versions: set[int] = set()
    deadline = time.monotonic() + 240
    try:
        while t.is_alive() and time.monotonic() < deadline:
            for mode in ("dense", "hybrid"):
                out = eng.search("read the complete contents of a file from the file system", 49, mode=mode)
                names = {h.name for h in out.hits}
                assert "filesystem__read_file" in names, (mode, out.version)
                assert len(out.hits) == len(mcp_docs), (mode, len(out.hits))
                seen_versions.add(out.version)
    finally:
        stop.set()
        t.join(timeout=120)
    assert not errors, errors
    assert rounds[0] == 6
    assert len(seen_versions) >= 3  # the searches really ran across several published snapshots
    assert eng.stats()["dense_index"]["live"] == len(mcp_docs)


def test_restart_computes_zero_new_embeddings(mcp_docs: list[ToolDoc], tmp_path: Path, shared_models: Path) -> None:
    state = _state_dir(tmp_path, shared_models)
    eng = Engine(state_dir=state)
    eng.load()
    assert eng.stats()["persisted_version"] == 0  # nothing written yet
    version = eng.update(mcp_docs, [])
    assert eng.stats()["embeddings_computed"] == len(mcp_docs)
    assert eng.stats()["persisted_version"] == version  # its snapshot is on disk
    before = eng.search("take a screenshot", 5)

    again = Engine(state_dir=state)
    again.load()
    # the persisted snapshot serves searches before the catalog is re-listed
    assert again.ready and len(again) == len(mcp_docs)
    assert again.stats()["persisted_version"] == again.version == version
    restored = again.search("take a screenshot", 5)
    assert [h.name for h in restored.hits] == [h.name for h in before.hits]
    again.update(mcp_docs, [])
    st = again.stats()
    assert st["embeddings_computed"] == 0 and st["snapshot_restored"] == 1
    assert again.search("take a screenshot", 5).hits == before.hits


def test_a_dense_index_from_before_principal_coordinates_is_rebuilt_once(
    mcp_docs: list[ToolDoc], tmp_path: Path, shared_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolatlas.retrieval import index

    monkeypatch.setattr(rank_mod, "HNSW_MIN", 0)  # every dense search through hnswlib
    state = _state_dir(tmp_path, shared_models)
    query = "read the contents of a text file"
    old = Engine(state_dir=state)  # a store on float32 vectors, as written before index.PROJECT_MIN
    old.load()
    old.update(mcp_docs, [])
    assert old._index.hnsw is not None and old._index.hnsw.basis is None
    before = [h.name for h in old.search(query, 10, mode="dense").hits]

    monkeypatch.setattr(index, "PROJECT_MIN", 20)
    monkeypatch.setattr(index, "PROJECT_DIMS", 32)
    upgraded = Engine(state_dir=state)
    upgraded.load()  # restores the snapshot: the store is built again on a basis, and written
    assert upgraded._index.hnsw is not None and upgraded._index.hnsw.basis is not None
    assert "hnsw_rebase_s" in upgraded.stats()["timings"]
    assert [h.name for h in upgraded.search(query, 10, mode="dense").hits] == before
    again = Engine(state_dir=state)
    again.load()  # loads that store with its basis: nothing rebuilt
    assert again._index.hnsw is not None and again._index.hnsw.basis is not None
    assert np.array_equal(again._index.hnsw.basis, upgraded._index.hnsw.basis)
    st = again.stats()
    assert "hnsw_rebase_s" not in st["timings"] and st["cache_corrupt"] == 0 and st["embeddings_computed"] == 0
    assert [h.name for h in again.search(query, 10, mode="dense").hits] == before


def test_corrupt_embedding_cache_is_detected_and_rebuilt(mcp_docs: list[ToolDoc], tmp_path: Path, shared_models: Path) -> None:
    state = _state_dir(tmp_path, shared_models)
    eng = Engine(state_dir=state)
    eng.load()
    eng.update(mcp_docs, [])
    cache_files = list((state / "retrieval").glob("embeddings-*.bin"))
    assert len(cache_files) == 1
    raw = bytearray(cache_files[0].read_bytes())
    raw[-100] ^= 0xFF
    cache_files[0].write_bytes(bytes(raw))
    for f in (state / "retrieval").glob("hnsw-*.idx"):
        f.write_bytes(b"garbage")

    second = Engine(state_dir=state)
    second.load()
    second.update(mcp_docs, [])
    st = second.stats()
    assert st["cache_corrupt"] >= 1
    assert st["embeddings_computed"] == len(mcp_docs)  # rebuilt, not trusted
    assert second.search("playwright_iframe_click", 1).hits[0].name == "playwright__playwright_iframe_click"

    third = Engine(state_dir=state)
    third.load()
    third.update(mcp_docs, [])
    assert third.stats()["embeddings_computed"] == 0 and third.stats()["cache_corrupt"] == 0


@pytest.mark.hostile
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_embedding_cache_and_dense_index_are_rebuilt(
    mcp_docs: list[ToolDoc], tmp_path: Path, shared_models: Path, kind: str
) -> None:
    """Issue #15 item 11: a directory or a FIFO where the embedding cache and the hnswlib file
    belong is counted corrupt and rebuilt, never a crash and never a blocked open()."""
    docs = mcp_docs[:40]
    state = _state_dir(tmp_path, shared_models)
    first = Engine(state_dir=state)
    first.load()
    first.update(docs, [])
    planted = [*(state / "retrieval").glob("embeddings-*.bin"), *(state / "retrieval").glob("hnsw-*.idx")]
    assert len(planted) == 2
    for path in planted:
        plant_unreadable(path, kind)

    second = Engine(state_dir=state)
    second.load()
    second.update(docs, [])
    st = second.stats()
    assert st["cache_corrupt"] >= 1 and st["embeddings_computed"] == len(docs)  # rebuilt, not trusted
    assert docs[0].name in [h.name for h in second.search(docs[0].name, 5).hits]
    # ... and written: what was in their place is moved aside, so a restart embeds nothing
    assert st["persist_failures"] == 0 and all(p.is_file() for p in planted), st
    third = Engine(state_dir=state)
    third.load()
    third.update(docs, [])
    assert third.stats()["embeddings_computed"] == 0 and third.stats()["cache_corrupt"] == 0


@pytest.mark.slow
def test_the_current_export_clears_an_earlier_format_in_state_dir(tmp_path: Path) -> None:
    # The current export is already there (the suite's, linked: this test pays no export),
    # beside an earlier format's folder that a kill between the export's rename and its
    # clean-up would leave. The first use removes the stale folder and nothing else.
    # (tests/e2e/test_fresh_start.py covers the same clean-up right after a real export.)
    stale = tmp_path / "models" / "minilm-l6-v2-onnx-v1"
    stale.mkdir(parents=True)
    (stale / "model.onnx").write_bytes(b"x" * 1024)
    unrelated = tmp_path / "models" / "other-model"
    unrelated.mkdir()
    (tmp_path / "models" / _EXPORT_DIRNAME).symlink_to(shared_onnx_models() / _EXPORT_DIRNAME)
    folder = ensure_onnx_export(tmp_path)
    assert folder == tmp_path / "models" / _EXPORT_DIRNAME
    assert sorted(p.name for p in (tmp_path / "models").iterdir() if not p.name.startswith(".")) == [
        _EXPORT_DIRNAME, "other-model"
    ]
    assert get_embedder("onnx", tmp_path).embed_queries(["read a file"]).shape == (1, 384)


def test_embedder_failure_degrades_to_bm25(mcp_docs: list[ToolDoc], tmp_path: Path) -> None:
    # A broken model on disk (complete-looking export, unreadable weights) must not stop search.
    state = tmp_path / "state"
    export = state / "models" / _EXPORT_DIRNAME
    export.mkdir(parents=True)
    files = {"model.onnx": b"not a model", "model.int8.onnx": b"not a model either", "tokenizer.json": b"{}"}
    for name, data in files.items():
        (export / name).write_bytes(data)
    (export / "manifest.json").write_text(json.dumps({"format": 1, "files": {n: len(d) for n, d in files.items()}}))
    with pytest.raises(EmbedderUnavailable):
        get_embedder("onnx", state)

    eng = Engine(state_dir=state)
    eng.load()
    eng.update(mcp_docs, [])
    out = eng.search("playwright_iframe_click", 3)
    assert out.degraded == "bm25-only"
    assert out.hits[0].name == "playwright__playwright_iframe_click"
    assert eng.search("playwright_iframe_click", 3, mode="bm25").degraded is None
    st = eng.stats()
    assert st["degraded"] == "bm25-only" and st["embedder_failures"] == 1
    assert st["degraded_searches"] >= 1 and st["embedder_error"]


def test_an_engine_runs_numpy_blas_on_one_thread() -> None:
    # OpenBLAS helper threads busy-wait after a call and fight the query embedder's threads
    from threadpoolctl import threadpool_info

    Engine(state_dir=None, embedder="none")
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas and all(i["num_threads"] == 1 for i in blas)


def test_embedder_none_is_plain_bm25(mcp_docs: list[ToolDoc]) -> None:
    eng = Engine(state_dir=None, embedder="none")
    eng.load()
    eng.update(mcp_docs, [])
    out = eng.search("playwright_iframe_click", 3)
    assert out.degraded is None and out.hits[0].name == "playwright__playwright_iframe_click"
    assert eng.stats()["embeddings_computed"] == 0


def test_empty_engine_reports_no_index() -> None:
    eng = Engine(state_dir=None, embedder="none")
    assert not eng.ready and eng.version == 0 and len(eng) == 0
    out = eng.search("anything", 5)
    assert out.hits == [] and out.degraded == "no-index"


def test_relevance_labels_resolve(mcp_docs: list[ToolDoc]) -> None:
    _, key_of = load_catalog(MCP / "catalog.jsonl")
    qs = load_queries(MCP / "queries.jsonl", key_of)
    names = {d.name for d in mcp_docs}
    assert len(qs) == 699 and all(q.relevant <= names for q in qs)


def test_hnsw_searches_run_during_a_save_and_wait_for_an_insert(tmp_path: Path) -> None:
    from toolatlas.retrieval.hnsw import HnswStore

    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(200, 16)).astype(np.float32)
    store = HnswStore(16, capacity=256)
    store.add(vecs)
    done = threading.Event()

    def search() -> None:
        assert len(store.search(vecs[0], 5, 32)[0]) == 5
        done.set()

    # shared (what save() holds while writing the file): a search goes ahead
    with store.lock.shared():
        t = threading.Thread(target=search)
        t.start()
        assert done.wait(10), "a search waited for a save"
    t.join()
    store.save(tmp_path / "x.idx")
    # exclusive (insert / delete): the search waits until it is released
    done.clear()
    with store.lock.exclusive():
        t = threading.Thread(target=search)
        t.start()
        assert not done.wait(0.3), "a search ran during an insert"
    assert done.wait(10)
    t.join()


def test_a_state_dir_refusing_writes_is_one_warning_and_said_in_the_stats(
    mcp_docs: list[ToolDoc], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes that fail (here: a regular file where the retrieval folder belongs; a read-only
    or full disk alike) are counted at each change, logged once, and said in the stats
    (catalog_status's index.persist_error) until a write succeeds again, which is logged."""
    blocker = tmp_path / "retrieval"
    blocker.write_text("not a folder")
    eng = Engine(state_dir=tmp_path, embedder="none")
    eng.load()
    with caplog.at_level("INFO", logger="toolatlas.retrieval"):
        for i in range(3):
            eng.update(mcp_docs[i * 5 : i * 5 + 5], [])
    st = eng.stats()
    assert st["persist_failures"] == 3 and st["persisted_version"] == 0, st
    assert st["persist_error"] is not None and str(tmp_path) in st["persist_error"], st
    assert sum("retrieval.persist_failed" in r.getMessage() for r in caplog.records) == 1, caplog.text
    assert eng.search(mcp_docs[0].name, 3).hits[0].name == mcp_docs[0].name  # served all the same
    blocker.unlink()
    caplog.clear()
    with caplog.at_level("INFO", logger="toolatlas.retrieval"):
        version = eng.update(mcp_docs[15:20], [])
    st = eng.stats()
    assert st["persist_error"] is None and st["persisted_version"] == version, st
    assert "retrieval.persist_recovered" in caplog.text


@pytest.mark.parametrize(("field", "value"), [("version", None), ("version", "x"), ("next_label", [1])])
def test_a_snapshot_whose_header_holds_a_bad_field_is_corrupt_not_a_crash(
    mcp_docs: list[ToolDoc], tmp_path: Path, field: str, value: object
) -> None:
    """The snapshot's JSON header is outside its checksum: a field there that is not a number
    (a flipped bit, an editor) made every start of the daemon die in restore with a
    TypeError, until the file was deleted by hand. It is a corrupt file: counted, rebuilt."""
    import struct

    from toolatlas.retrieval import persist

    eng = Engine(state_dir=tmp_path, embedder="none")
    eng.load()
    eng.update(mcp_docs[:10], [])
    path = persist.folder(tmp_path) / "snapshot-none.bin"
    raw = path.read_bytes()
    magic = len(b"TASNP01\n")
    (hlen,) = struct.unpack_from("<I", raw, magic)
    header = {**json.loads(raw[magic + 4 : magic + 4 + hlen]), field: value}
    hb = json.dumps(header).encode()
    path.write_bytes(raw[:magic] + struct.pack("<I", len(hb)) + hb + raw[magic + 4 + hlen :])

    again = Engine(state_dir=tmp_path, embedder="none")
    again.restore()
    assert again.stats()["cache_corrupt"] == 1 and not again.ready
    version = again.update(mcp_docs[:10], [])
    assert again.stats()["persisted_version"] == version and again.search(mcp_docs[0].name, 3).hits


def test_a_schema_integer_wider_than_64_bits_is_indexed_persisted_and_restored(tmp_path: Path) -> None:
    """A token amount's `"maximum": 2**256 - 1` made the snapshot write raise OverflowError
    (MessagePack holds 64 bits) out of update(): through the daemon, that upstream's tools
    never became searchable. It is kept as a float in the snapshot; an integer even a float
    cannot hold fails the write (said in the stats), never the update."""
    wide = {"type": "object", "properties": {"amount": {"type": "integer", "maximum": 2**256 - 1}}}
    docs = [ToolDoc(name="chain__transfer", server="chain", tool="transfer", description="Transfer tokens to an address",
                    input_schema=wide),
            ToolDoc(name="chain__balance", server="chain", tool="balance", description="Token balance of an address",
                    input_schema={"type": "object"})]
    eng = Engine(state_dir=tmp_path, embedder="none")
    eng.load()
    version = eng.update(docs, [])
    assert eng.stats()["persisted_version"] == version and eng.search("transfer tokens", 1).hits[0].name == "chain__transfer"

    again = Engine(state_dir=tmp_path, embedder="none")
    again.restore()
    assert again.stats()["snapshot_restored"] == 1 and again.version == version
    restored = {d.name: d for d in again.catalog_vectors()[1]}["chain__transfer"]
    assert restored.input_schema["properties"]["amount"]["maximum"] == float(2**256 - 1)

    wider = ToolDoc(name="chain__huge", server="chain", tool="huge", description="Huge", input_schema={"maximum": 2**2000})
    version = again.update([wider], [])
    st = again.stats()
    assert st["persisted_version"] < version and st["persist_error"] and "int" in st["persist_error"], st
    assert again.search("huge", 1).hits[0].name == "chain__huge"


def test_stale_temp_files_of_dead_writers_are_removed_at_load(tmp_path: Path) -> None:
    import subprocess
    import sys

    from toolatlas.retrieval import persist

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: its pid is free (or reused by a live process: then kept)
    retrieval = persist.folder(tmp_path)
    retrieval.mkdir(parents=True)
    stale = retrieval / f".snapshot-x.bin.{dead_pid}.tmp"
    live = retrieval / f".snapshot-x.bin.{os.getpid()}.tmp"
    other = retrieval / "notes.tmp"
    for f in (stale, live, other):
        f.write_bytes(b"partial")
    eng = Engine(state_dir=tmp_path, embedder="none")
    eng.load()
    if not persist._pid_alive(dead_pid):  # noqa: SLF001
        assert not stale.exists()
    assert live.exists() and other.exists()


def test_a_lone_query_takes_one_thread_while_other_work_holds_the_cores(shared_models: Path) -> None:
    """Issue 19: beside another process's work a second spinning thread waits for a core
    (measured: a longer tail), so a lone query runs on one thread while the host's runnable
    threads fill its cores; the probe reads the real host."""
    import subprocess
    import sys

    from toolatlas.retrieval.embed import OnnxEmbedder, cores_idle_for, usable_cores

    if usable_cores() < 2:
        pytest.skip("one usable core: no second thread to spin")
    emb = OnnxEmbedder(shared_models / _EXPORT_DIRNAME, "fp32", "int8", query_threads=2)
    emb.cores_idle = lambda extra: False
    emb.embed_queries(["read a file from disk"])
    assert emb.lone_queries == 0
    emb.cores_idle = lambda extra: True
    emb.embed_queries(["read a file from disk"])
    assert emb.lone_queries == 1
    # the probe itself: with a busy process on every core, one more thread finds none idle
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores())]
    try:
        deadline = time.monotonic() + 30
        while cores_idle_for(1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not cores_idle_for(1)
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_the_tokenizer_sees_a_bounded_prefix_of_an_outsized_text_and_the_vector_is_the_same(
        shared_models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the first MAX_SEQ_LEN tokens make a vector, but the tokenizer encoded the whole
    text first: a 10 MB description held ~1.4 GB and took 7 s (`rift --catalog`, `eval`,
    a megabyte search query). It now sees MAX_TEXT_CHARS characters; the vectors are those
    of the whole text. (The tokenizer is wrapped to see what it is handed.)"""
    from toolatlas.retrieval import embed as embed_module
    from toolatlas.retrieval.embed import MAX_TEXT_CHARS, OnnxEmbedder

    emb = OnnxEmbedder(shared_models / _EXPORT_DIRNAME, "fp32", "int8")
    seen: list[int] = []
    real = emb._tok  # noqa: SLF001

    class Seeing:
        def encode_batch(self, texts: list[str]) -> object:
            seen.extend(len(t) for t in texts)
            return real.encode_batch(texts)

    big = "search the issue tracker for open bugs " + "and more words " * 200_000
    with monkeypatch.context() as m:
        m.setattr(embed_module, "MAX_TEXT_CHARS", 10**9)
        whole = emb.embed([big])  # the whole text tokenized, as before
    emb._tok = Seeing()  # noqa: SLF001
    assert np.array_equal(emb.embed([big]), whole) and np.array_equal(emb.embed([big[:MAX_TEXT_CHARS]]), whole)
    emb.embed_queries([big])
    assert seen and max(seen) <= MAX_TEXT_CHARS, seen
