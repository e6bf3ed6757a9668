"""A background engine (the daemon's, #16 item 4): BM25 before the model, hybrid after the
worker's steps, small changes embedded inline, large ones in the background, and a restart
that restores the dense index before the model loads. The real packaged MiniLM over ONNX (the
export shared by the suite); the published catalogs of ../shared/benchdata."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from tests.support.daemon import seed_shared_models
from toolatlas.evaluation.datasets import benchdata_dir, load_catalog
from toolatlas.retrieval.model_files import EXPORT_DIRNAME
from toolatlas.retrieval.engine import INLINE_EMBED_MAX, Engine, ModelPhase, ToolDoc
from toolatlas.retrieval.warmup import EMBEDDING_NEW, LOADING, ModelProgress


@pytest.fixture(scope="module")
def catalogs() -> tuple[list[ToolDoc], list[ToolDoc]]:
    small, _ = load_catalog(benchdata_dir() / "mcptoolbenchpp" / "catalog.jsonl")
    large, _ = load_catalog(benchdata_dir() / "toollens" / "catalog.jsonl")
    assert len(large) > INLINE_EMBED_MAX
    return small, large


def _state(tmp_path: Path) -> Path:
    return seed_shared_models(tmp_path / "index")


def test_progress_record_says_what_is_missing() -> None:
    p = ModelProgress(ModelPhase.WAITING)
    assert p.pending and p.degraded == LOADING
    p = p.to(ModelPhase.EMBEDDING, embedded=3, total=10)
    assert p.degraded == LOADING and "3 of 10" in p.describe()
    # for a caller who may not see every server: no counts of the whole catalog
    assert "embedding documents (" in p.describe(counts=False) and "10" not in p.describe(counts=False)
    ready = p.to(ModelPhase.READY, hybrid_once=True)
    assert not ready.pending and ready.degraded is None
    assert ready.to(ModelPhase.EMBEDDING).degraded == EMBEDDING_NEW  # after the first hybrid
    failed = p.to(ModelPhase.FAILED, error="no model")
    assert not failed.pending and failed.degraded == "bm25-only" and "no model" in failed.describe()
    assert ModelProgress(ModelPhase.OFF).degraded is None and not ModelProgress(ModelPhase.OFF).pending


def test_background_engine_serves_bm25_first_then_hybrid(
    tmp_path: Path, catalogs: tuple[list[ToolDoc], list[ToolDoc]],
) -> None:
    small, large = catalogs
    state = _state(tmp_path)
    eng = Engine(state_dir=state, background=True)
    eng.restore()
    v1 = eng.update(small, [])
    out = eng.search("take a screenshot of the page")
    assert out.hits and out.degraded == LOADING  # BM25 answers before any model
    assert eng.progress.phase is ModelPhase.WAITING and eng.stats()["dense_index"] is None

    assert eng.load_model() is not None
    assert eng.progress.phase is ModelPhase.EMBEDDING
    assert eng.embed_pending()  # one batch embedded, more to do (publishing)
    assert eng.progress.embedded == len(small) == eng.progress.total
    assert eng.search("take a screenshot of the page").degraded == LOADING  # not published yet
    assert not eng.embed_pending()  # nothing left: the hybrid snapshot is published
    assert eng.progress.phase is ModelPhase.READY and eng.version > v1
    st = eng.stats()
    assert st["degraded"] is None and st["dense_index"]["live"] == len(small)
    assert st["embeddings_computed"] == len(small)
    assert eng.search("take a screenshot of the page").degraded is None

    # A small change is embedded inside update(), as before: hybrid throughout.
    one = msgspec.structs.replace(small[0], name="extra__pizza", server="extra", tool="pizza",
                              description="Order a pizza for delivery.")
    eng.update([one], [])
    assert eng.progress.phase is ModelPhase.READY
    hit = eng.search("order a pizza")
    assert hit.degraded is None and hit.hits[0].name == "extra__pizza"

    # A large one is searchable by BM25 at once and embedded by the worker's steps.
    eng.update(large, [])
    assert eng.progress.phase is ModelPhase.EMBEDDING
    during = eng.search("order a pizza")
    assert during.degraded == EMBEDDING_NEW and during.hits[0].name == "extra__pizza"
    assert len(eng) == len(small) + 1 + len(large)
    while eng.embed_pending():
        pass
    assert eng.progress.phase is ModelPhase.READY and eng.degraded is None
    assert eng.stats()["dense_index"]["live"] == len(eng)

    # A restart restores the dense index before any model is loaded, and embeds nothing.
    again = Engine(state_dir=state, background=True)
    again.restore()
    st = again.stats()
    assert st["tools"] == len(eng) and st["dense_index"]["live"] == len(eng)
    assert again.search("order a pizza").degraded == LOADING  # no query embedder yet
    assert again.load_model() is not None
    assert not again.embed_pending()
    assert again.progress.phase is ModelPhase.READY and again.stats()["embeddings_computed"] == 0
    assert again.search("order a pizza").degraded is None


def test_a_model_that_fails_leaves_bm25_and_stays_failed(
    tmp_path: Path, catalogs: tuple[list[ToolDoc], list[ToolDoc]],
) -> None:
    small, large = catalogs
    # A complete-looking export whose files are not models: loading fails, search goes on.
    export = tmp_path / "index" / "models" / EXPORT_DIRNAME
    export.mkdir(parents=True)
    files = {"model.onnx": b"not a model", "model.int8.onnx": b"not a model either", "tokenizer.json": b"{}"}
    for name, data in files.items():
        (export / name).write_bytes(data)
    (export / "manifest.json").write_text(json.dumps({"format": 1, "files": {n: len(d) for n, d in files.items()}}))
    eng = Engine(state_dir=tmp_path / "index", background=True)
    eng.restore()
    eng.update(small, [])
    assert eng.load_model() is None
    assert eng.progress.phase is ModelPhase.FAILED and eng.progress.error
    assert not eng.embed_pending()
    eng.update(large, [])  # a large change does not wake a failed model
    assert eng.progress.phase is ModelPhase.FAILED and not eng.progress.pending
    out = eng.search("take a screenshot of the page")
    assert out.hits and out.degraded == "bm25-only"
    assert eng.stats()["embedder_failures"] == 1


def test_a_small_catalog_is_hybrid_before_its_graph_is_built_and_persisted_with_it(
    tmp_path: Path, catalogs: tuple[list[ToolDoc], list[ToolDoc]],
) -> None:
    """Below rank.HNSW_MIN tools search is an exact scan, so the first hybrid snapshot is
    published before its vectors go into hnswlib (issue 21: a second replica's start); the
    graph is complete and on disk after the same step, and a restart restores it whole."""
    from toolatlas.retrieval.rank import HNSW_MIN

    small, _ = catalogs
    assert len(small) < HNSW_MIN
    state = _state(tmp_path)
    eng = Engine(state_dir=state, background=True)
    eng.restore()
    eng.update(small, [])
    assert eng.load_model() is not None
    while eng.embed_pending():
        pass
    st = eng.stats()
    assert eng.progress.phase is ModelPhase.READY and st["degraded"] is None
    assert "hnsw_after_ready_s" in st["timings"] and st["persisted_version"] == st["version"]
    hnsw = eng._index.hnsw
    assert hnsw is not None and eng._index.deferred is None
    assert hnsw.index.get_current_count() == hnsw.live == len(small)
    labels = sorted(int(x) for x in eng._snap.labels) if eng._snap is not None and eng._snap.labels is not None else []
    assert labels == sorted(int(x) for x in hnsw.index.get_ids_list())
    expected = [h.name for h in eng.search("take a screenshot of the page", 5).hits]

    again = Engine(state_dir=state, background=True)
    again.restore()
    assert again.stats()["dense_index"]["live"] == len(small)
    assert again.load_model() is not None and not again.embed_pending()
    assert [h.name for h in again.search("take a screenshot of the page", 5).hits] == expected
