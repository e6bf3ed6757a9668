"""Memory of the index (issue 19 item 3): int16 snapshot vectors, the mapped embedding
cache with its LRU bound, interned schemas and tokens. Real files, real numpy; no mocks."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

from toolatlas.catalog.model import ToolRecord
from toolatlas.catalog.schemas import intern_schema, pooled_schemas
from toolatlas.retrieval import index, persist, rows, store
from toolatlas.retrieval.documents import ToolDoc, Vocab, make_entry
from toolatlas.retrieval.index import IndexBuilder, build_snapshot

DIM = 8


def _docs(n: int) -> list[ToolDoc]:
    return [ToolDoc(name=f"s{i % 3}__t{i}", server=f"s{i % 3}", tool=f"t{i}", description=f"tool number {i} reads files",
                    input_schema={"type": "object", "properties": {"q": {"type": "string"}}}) for i in range(n)]


def _unit(n: int, seed: int = 1) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    out: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def _labelled(docs: list[ToolDoc], vecs: np.ndarray) -> tuple[dict[str, object], dict[bytes, np.ndarray]]:
    entries = {}
    vec_of = {}
    vocab = Vocab()
    for i, (d, v) in enumerate(zip(docs, vecs)):
        e = dataclasses.replace(make_entry(d, vocab), label=i)
        entries[d.name] = e
        vec_of[e.key] = v
    return entries, vec_of


def test_large_snapshot_stores_int16_rows_and_scores_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    docs, vecs = _docs(40), _unit(40)
    entries, vec_of = _labelled(docs, vecs)
    small = build_snapshot(1, entries, vec_of, DIM)  # type: ignore[arg-type]
    monkeypatch.setattr(index, "COMPACT_ABOVE", 10)
    monkeypatch.setattr(rows, "CHUNK", 7)  # several chunks
    big = build_snapshot(1, entries, vec_of, DIM)  # type: ignore[arg-type]
    assert small.vecs is not None and small.vecs.dtype == np.float32 and small.scales is None
    assert big.vecs is not None and big.vecs.dtype == np.int16 and big.scales is not None
    assert big.vecs.nbytes * 2 == small.vecs.nbytes
    q = vecs[3]
    full, some = big.sims(q), big.sims(q, np.array([5, 1, 30]))
    assert full.dtype == np.float32 and some.dtype == np.float32
    assert np.abs(full - small.sims(q)).max() < 2e-5  # each element off by at most max|x| / 65534
    assert np.abs(full - small.sims(q)).max() > 0  # rounded: this is not the float32 matrix
    assert np.allclose(some, full[[5, 1, 30]])
    assert big.rows().dtype == np.float32 and np.abs(big.rows() - vecs).max() < 2e-5
    assert np.array_equal(big.rows(np.array([4, 2])), big.rows()[[4, 2]])
    assert int(np.argmax(full)) == 3
    assert big.centroids is not None and np.array_equal(big.centroids, small.centroids)  # from the float32 vectors


def test_quantized_rows_keep_zero_and_extreme_rows() -> None:
    mat = np.array([[0.0, 0.0, 0.0], [1.0, -1.0, 0.5], [1e-8, -3e-8, 0.0]], dtype=np.float32)
    q, scale = rows.quantize(mat)
    assert q.dtype == np.int16 and scale.dtype == np.float32
    assert np.array_equal(q[0], [0, 0, 0]) and scale[0] == 1.0  # a zero row: no division by zero
    assert q[1].tolist() == [32767, -32767, 16384]  # the largest magnitude takes the whole range
    assert np.allclose(rows.take(q, scale), mat, atol=1e-4 * np.abs(mat).max(axis=1, keepdims=True) + 1e-12)
    assert np.allclose(rows.sims(q, scale, np.array([1.0, 1.0, 1.0], np.float32)), mat.sum(axis=1), rtol=1e-4, atol=1e-12)


def test_embedding_file_is_mapped_checked_and_rewritten(tmp_path: Path) -> None:
    keys = [bytes([i]) * 32 for i in range(5)]
    vecs = _unit(5)
    on_disk = persist.save_embeddings(tmp_path, "m", dict(zip(keys, vecs)))
    assert list(on_disk) == keys and all(persist.is_mapped(v) for v in on_disk.values())
    loaded = persist.load_embeddings(tmp_path, "m", DIM)
    assert all(persist.is_mapped(v) for v in loaded.values())
    assert np.array_equal(np.stack([loaded[k] for k in keys]), vecs)
    persist.release_pages()  # pages dropped from this process: read again on use
    assert np.array_equal(np.stack([loaded[k] for k in keys]), vecs)
    assert not persist.is_mapped(vecs[0]) and not persist.is_mapped(vecs[0].copy())
    path = persist.embeddings_path(tmp_path, "m")
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(persist.CorruptFile, match="checksum"):
        persist.load_embeddings(tmp_path, "m", DIM)
    path.write_bytes(bytes(raw[:20]))
    with pytest.raises(persist.CorruptFile):
        persist.load_embeddings(tmp_path, "m", DIM)
    assert persist.load_embeddings(tmp_path / "none", "m", DIM) == {}


def test_vectors_to_keep_is_lru_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "KEEP_MIN", 4)
    vec_of = {bytes([i]) * 32: np.full(DIM, i, np.float32) for i in range(10)}  # order = recency
    live = {bytes([2]) * 32}
    kept = store.vectors_to_keep(vec_of, live)
    assert set(kept) == {bytes([i]) * 32 for i in (2, 9, 8, 7)}  # live, then the newest


def test_remap_leaves_only_live_and_unwritten_vectors_on_the_heap(tmp_path: Path) -> None:
    b = IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})
    docs = _docs(3)
    entries, vec_of = _labelled(docs, _unit(3))
    old = {bytes([200 + i]) * 32: _unit(1, i)[0] for i in range(3)}  # no longer live, heap copies
    b.vec_of = {**old, **vec_of}
    snap, _ = b.commit(entries, [], 1, None, DIM)  # type: ignore[arg-type]
    assert snap.vecs is not None and snap.vecs.dtype == np.float32
    live_rows = {k: b.vec_of[k] for k in vec_of}
    written = persist.save_embeddings(tmp_path, "m", {k: b.vec_of[k] for k in [*list(old)[1:], *vec_of]})
    b.remap(written)
    assert list(old)[0] not in b.vec_of  # the file no longer keeps it: gone from memory too
    assert all(persist.is_mapped(b.vec_of[k]) for k in list(old)[1:])
    assert all(b.vec_of[k] is live_rows[k] and b.vec_of[k].base is snap.vecs for k in vec_of)  # rows untouched


def test_int16_snapshot_keeps_exact_vectors_in_the_file_not_on_the_heap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})
    docs = _docs(30)
    vecs = _unit(30)
    entries, vec_of = _labelled(docs, vecs)
    b.vec_of = dict(vec_of)
    small, _ = b.commit(dict(list(entries.items())[:20]), [], 1, None, DIM)  # type: ignore[arg-type]
    assert small.vecs is not None and small.vecs.dtype == np.float32
    assert all(b.vec_of[e.key].base is small.vecs for e in b.entries.values())
    monkeypatch.setattr(index, "COMPACT_ABOVE", 25)
    big, _ = b.commit(entries, [], 2, None, DIM)  # type: ignore[arg-type]  # the catalog grew past it
    assert big.vecs is not None and big.vecs.dtype == np.int16
    for i, e in enumerate(b.entries.values()):
        got = b.vec_of[e.key]
        assert got.dtype == np.float32 and np.array_equal(got, vecs[i])  # the originals, not rounded rows
        assert got.base is not small.vecs  # the old float32 matrix is not kept alive by a view
    written = persist.save_embeddings(tmp_path, "m", dict(b.vec_of))
    b.remap(written)
    assert all(persist.is_mapped(b.vec_of[e.key]) for e in b.entries.values())  # heap copies gone
    back = persist.load_embeddings(tmp_path, "m", DIM)
    assert np.array_equal(np.stack([back[e.key] for e in b.entries.values()]), vecs)  # the file stays exact


def test_int16_snapshot_ranks_like_float32_on_hnsw_candidates_and_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolatlas.retrieval import rank
    from toolatlas.retrieval.hnsw import HnswStore

    n = 300
    docs, vecs = _docs(n), _unit(n, seed=5)
    entries, vec_of = _labelled(docs, vecs)
    store_ = HnswStore(DIM, capacity=n)
    labels = store_.add(vecs)
    assert list(labels) == list(range(n))
    monkeypatch.setattr(rank, "HNSW_MIN", 150)  # all 300 through hnswlib; one server's 100 scanned
    exact_snap = build_snapshot(1, entries, vec_of, DIM, store_)  # type: ignore[arg-type]
    monkeypatch.setattr(index, "COMPACT_ABOVE", 10)
    snap = build_snapshot(1, entries, vec_of, DIM, store_)  # type: ignore[arg-type]
    assert snap.vecs is not None and snap.vecs.dtype == np.int16
    q = vecs[17]
    pos, sims = rank.dense(snap, q, 20, None, None)  # hnswlib's candidates, scored on the rows
    want_pos, want_sims = rank.dense(exact_snap, q, 20, None, None)
    assert pos[0] == 17 and np.array_equal(pos, want_pos) and np.abs(sims - want_sims).max() < 2e-5
    scope = ("s1",)  # 100 documents, under HNSW_MIN: an exact scan of the int16 rows
    allowed = snap.allowed(scope)
    pos, sims = rank.dense(snap, q, 20, scope, allowed)
    want_pos, want_sims = rank.dense(exact_snap, q, 20, scope, exact_snap.allowed(scope))
    assert np.array_equal(pos, want_pos) and np.abs(sims - want_sims).max() < 2e-5
    # a query no document's words match: the fused candidates are hnswlib's
    got = rank.fused_scores(rank.QueryScores(snap, "zzzz", q, None), None, "z")
    want = rank.fused_scores(rank.QueryScores(exact_snap, "zzzz", q, None), None, "z")
    assert np.array_equal(got[0], want[0]) and np.abs(got[1] - want[1]).max() < 1e-4


def test_snapshot_share_moves_live_keys_last_and_keeps_mapped_views(tmp_path: Path) -> None:
    b = IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})
    docs = _docs(4)
    entries, vec_of = _labelled(docs, _unit(4))
    stale = {bytes([250]) * 32: _unit(1, 9)[0]}
    mapped = persist.save_embeddings(tmp_path, "m", {**stale, **vec_of})
    b.vec_of = dict(mapped)
    snap, failure = b.commit(entries, [], 1, None, DIM)  # type: ignore[arg-type]
    assert failure is None and snap.vecs is not None
    assert list(b.vec_of)[0] == bytes([250]) * 32  # the stale key is now the oldest
    assert persist.is_mapped(b.vec_of[bytes([250]) * 32])  # still a view of the file, not copied
    assert all(b.vec_of[e.key].base is snap.vecs for e in b.entries.values())


def test_schemas_are_interned_with_their_key_order() -> None:
    a = {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}
    b = {"properties": {"z": {"type": "string"}, "a": {"type": "integer"}}, "type": "object"}
    sa, sb = intern_schema(a), intern_schema(b)
    assert sa is sb and sa == a and list(sa) == list(a)
    r1 = ToolRecord.make("s", "t1", "d", dict(a))
    r2 = ToolRecord.make("s2", "t2", "d", dict(b))
    assert r1.input_schema is r2.input_schema is sa
    # the pool is process-wide: collect what earlier tests in this worker left first, so the
    # counts below move only with this test's own schema
    gc.collect()
    n = pooled_schemas()
    unique = intern_schema({"type": "object", "title": "only once"})
    held = weakref.ref(unique)
    assert pooled_schemas() == n + 1
    del unique
    gc.collect()
    assert held() is None and pooled_schemas() == n  # weak: gone with its last holder
    odd = {"type": "object", "x": object()}  # not JSON: kept as it is
    assert intern_schema(odd) is odd


def test_restored_documents_share_strings_and_schemas_with_records(tmp_path: Path) -> None:
    rec = ToolRecord.make("srv", "read_file", "Read a file from disk", {"type": "object", "properties": {"path": {"type": "string"}}})
    doc = ToolDoc(name=rec.name, server="srv", tool=rec.tool, description=rec.description, input_schema=rec.input_schema)
    persist.save_snapshot(tmp_path, "none", version=1, docs=[doc], labels=[-1], hnsw=None)
    got = persist.load_snapshot(tmp_path, "none")
    assert got is not None
    back = got.docs[0]
    assert back == doc and back.input_schema is rec.input_schema and back.description is rec.description
    vocab = Vocab()
    e1, e2 = make_entry(doc, vocab), make_entry(back, vocab)
    assert e1.terms == e2.terms and e1.tokens == e2.tokens and len(vocab) == len(set(e1.tokens))


def test_the_builder_does_not_keep_a_replaced_entries_dict_alive() -> None:
    b = IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})
    docs = _docs(6)
    old, vec_of = _labelled(docs[:3], _unit(3))
    old = {name: dataclasses.replace(e, label=-1) for name, e in old.items()}  # type: ignore[type-var]
    b.entries = old  # type: ignore[assignment]
    assert set(b.pending(10)) == {e.key for e in old.values()}  # type: ignore[attr-defined]  # the queue is made from `old`
    new, new_vecs = _labelled(docs, _unit(6, seed=2))
    b.vec_of = dict(new_vecs)
    snap, failure = b.commit(new, [], 1, None, DIM)  # type: ignore[arg-type]
    assert failure is None and snap.n == 6 and b.entries is new
    # only this test's own names refer to the replaced dict: the builder lets it go
    assert not [r for r in gc.get_referrers(old) if r is b or r is vars(b)]
    assert b.pending(10) == {}
