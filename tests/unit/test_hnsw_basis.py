"""hnswlib over principal coordinates (retrieval/hnsw.py `basis`, index.PROJECT_MIN): a store
that holds each vector's leading coordinates, the builder that moves a growing catalog onto
one with its labels kept, the dense branch that scores the candidates exactly, and the basis
kept with the snapshot on disk. Real hnswlib, real numpy, real files; vectors are seeded into
the builder's cache, so the embedder it is handed is never asked to embed."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from toolatlas.retrieval import index, persist, rank, store
from toolatlas.retrieval.documents import ToolDoc, Vocab, make_entry
from toolatlas.retrieval.hnsw import HnswStore, principal_basis
from toolatlas.retrieval.index import IndexBuilder

DIM = 48


def _unit(n: int, seed: int) -> np.ndarray:
    # twelve strong directions and a weak rest, as text embeddings have a few
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, 12)) @ rng.normal(size=(12, DIM)) + rng.normal(0, 0.05, size=(n, DIM))
    out: np.ndarray = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    return out


def _docs(n: int, start: int = 0) -> list[ToolDoc]:
    return [ToolDoc(name=f"s{i % 4}__t{i}", server=f"s{i % 4}", tool=f"t{i}", description=f"tool {i} does things",
                    input_schema={"type": "object"}) for i in range(start, start + n)]


def _builder(docs: list[ToolDoc], vecs: np.ndarray) -> IndexBuilder:
    b = IndexBuilder({"embeddings_computed": 0, "embeddings_cached": 0, "embeddings_shared": 0})
    b.seed(docs, vecs)
    return b


def _entries(b: IndexBuilder, docs: list[ToolDoc]) -> dict[str, object]:
    old = dict(b.entries)
    for d in docs:
        old.setdefault(d.name, make_entry(d, b.vocab))
    return old


EMB = types.SimpleNamespace(dim=DIM)  # every vector is in the cache: only its width is read


def test_a_full_principal_basis_keeps_dot_products() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    p = principal_basis(x, 32)
    assert p.shape == (8, 8)
    assert np.allclose((x @ p) @ (x[0] @ p), x @ x[0], atol=1e-3)
    lead = principal_basis(x, 2)  # the two directions of the largest second moment
    assert np.allclose(np.abs(lead.T @ p[:, :2]), np.eye(2), atol=1e-5)


def test_a_store_with_a_basis_holds_the_coordinates_and_checks_the_basis(tmp_path: Path) -> None:
    vecs = _unit(500, 1)
    basis = principal_basis(vecs, 16)
    s = HnswStore(DIM, capacity=500, basis=basis)
    assert s.held_dim == 16 and s.index.dim == 16 and s.index.space == "ip"
    labels = s.add(vecs)
    got, dists = s.search(vecs[7], 5, ef=64)
    assert got[0] == labels[7]
    proj = vecs @ basis
    assert np.allclose(dists, 1.0 - proj[got] @ proj[7], atol=1e-5)  # distances in the coordinates
    assert s.native_bytes() < HnswStore(DIM, capacity=500).native_bytes()
    s.save(tmp_path / "h.idx")
    back = HnswStore.load(tmp_path / "h.idx", DIM, s.next_label, live=500, basis=basis)
    assert np.array_equal(back.search(vecs[7], 5, ef=64)[0], got)
    with pytest.raises(ValueError, match="must be"):
        HnswStore(DIM, basis=np.zeros((DIM + 1, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="must be"):
        HnswStore.load(tmp_path / "h.idx", DIM, 500, live=500, basis=np.zeros((4,), dtype=np.float32))


def test_the_builder_moves_a_growing_catalog_onto_principal_coordinates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "PROJECT_MIN", 300)
    monkeypatch.setattr(index, "PROJECT_DIMS", 12)
    monkeypatch.setattr(rank, "HNSW_MIN", 0)  # every search through hnswlib
    docs, vecs = _docs(600), _unit(600, 2)
    b = _builder(docs, vecs)
    small, failure = b.commit(_entries(b, docs[:200]), [], 1, EMB)  # type: ignore[arg-type]
    assert failure is None and small.hnsw is not None and small.hnsw.basis is None
    first_labels = {name: e.label for name, e in b.entries.items()}
    # grown past PROJECT_MIN, with one document gone (insert, delete, then the new store)
    gone = docs[0].name
    grown_entries = {k: v for k, v in _entries(b, docs).items() if k != gone}
    big, failure = b.commit(grown_entries, [first_labels[gone]], 2, EMB)  # type: ignore[arg-type]
    assert failure is None and big.hnsw is not None and big.hnsw is b.hnsw
    assert big.hnsw.basis is not None and big.hnsw.basis.shape == (DIM, 12)
    assert big.hnsw is not small.hnsw and small.hnsw.basis is None  # the old snapshot keeps its own
    assert big.hnsw.live == 599 and "hnsw_rebase_s" in b.timings
    assert all(b.entries[n].label == first_labels[n] for n in first_labels if n != gone)  # labels kept
    assert big.hnsw.next_label == 600
    # the dense branch scores twice the candidates it keeps on the float32 rows: exact scores,
    # in order, and (twelve coordinates hold nearly all of these vectors) the exact 10 nearest
    live = np.array([i for i in range(600) if i != 0])
    found = 0
    for qi in range(1, 600, 20):
        q = vecs[qi]
        pos, sims = rank.dense(big, q, 10, None, None)
        assert pos.shape[0] == 10 and np.allclose(sims, vecs[[int(big.docs[p].tool[1:]) for p in pos]] @ q, atol=1e-6)
        assert np.all(np.diff(sims) <= 0) and big.docs[pos[0]].name == docs[qi].name
        exact = {docs[i].name for i in live[np.argsort(-(vecs[live] @ q), kind="stable")[:10]]}
        found += len(exact & {big.docs[p].name for p in pos})
    assert found >= 0.97 * 30 * 10
    # the older snapshot still searches its own store
    pos, _ = rank.dense(small, vecs[5], 3, None, None)
    assert small.docs[pos[0]].name == docs[5].name
    # another change keeps the basis: no second rebuild
    again, _ = b.commit(_entries(b, []), [], 3, EMB)  # type: ignore[arg-type]
    assert again.hnsw is big.hnsw


def test_a_first_large_commit_starts_on_principal_coordinates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "PROJECT_MIN", 100)
    docs, vecs = _docs(150), _unit(150, 3)
    b = _builder(docs, vecs)
    snap, _ = b.commit(_entries(b, docs), [], 1, EMB)  # type: ignore[arg-type]
    assert snap.hnsw is not None and snap.hnsw.basis is not None and "hnsw_rebase_s" not in b.timings


def test_the_basis_is_kept_with_the_snapshot_and_a_file_without_one_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index, "PROJECT_MIN", 100)
    monkeypatch.setattr(rank, "HNSW_MIN", 0)
    docs, vecs = _docs(150), _unit(150, 4)
    b = _builder(docs, vecs)
    snap, _ = b.commit(_entries(b, docs), [], 1, EMB)  # type: ignore[arg-type]
    assert snap.hnsw is not None and snap.hnsw.basis is not None
    assert store.write(tmp_path, "m", b, snap)
    restored = persist.load_snapshot(tmp_path, "m")
    assert restored is not None and restored.basis is not None
    assert np.array_equal(restored.basis, snap.hnsw.basis) and restored.basis_energy == snap.hnsw.fit_energy < 1.0
    revived = store.revive(restored, dict(b.vec_of), DIM, Vocab())
    assert revived.corrupt == 0 and revived.hnsw is not None and revived.hnsw.basis is not None
    assert revived.hnsw.fit_energy == snap.hnsw.fit_energy and revived.hnsw.added == 0
    assert np.array_equal(revived.hnsw.search(vecs[9], 4, ef=64)[0], snap.hnsw.search(vecs[9], 4, ef=64)[0])
    # a snapshot from before stores had a basis: its file holds the vectors
    small = _builder(docs[:50], vecs[:50])
    old, _ = small.commit(_entries(small, docs[:50]), [], 1, EMB)  # type: ignore[arg-type]
    assert old.hnsw is not None and old.hnsw.basis is None
    assert store.write(tmp_path / "old", "m", small, old)
    restored = persist.load_snapshot(tmp_path / "old", "m")
    assert restored is not None and restored.basis is None
    revived = store.revive(restored, dict(small.vec_of), DIM, Vocab())
    assert revived.hnsw is not None and revived.hnsw.basis is None and revived.hnsw.search(vecs[9], 1, ef=64)[0][0] == 9
    # a basis that does not fit the vectors' width: the file is not used, the index is rebuilt
    wrong = persist.Restored(version=1, docs=restored.docs, labels=restored.labels, next_label=restored.next_label,
                             hnsw_path=restored.hnsw_path, basis=np.zeros((DIM - 1, 4), dtype=np.float32))
    assert store.revive(wrong, dict(small.vec_of), DIM, Vocab()).corrupt == 1


def _subspace(n: int, seed: int, dirs: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, dirs.shape[0])) @ dirs + rng.normal(0, 0.05, size=(n, DIM))
    out: np.ndarray = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    return out


def test_a_basis_that_no_longer_fits_what_arrives_is_fitted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "PROJECT_MIN", 1000)
    monkeypatch.setattr(index, "PROJECT_DIMS", 24)
    axes = np.linalg.qr(np.random.default_rng(9).normal(size=(DIM, DIM)))[0].T.astype(np.float32)
    a, b = axes[:12], axes[12:24]  # two kinds of text, in orthogonal directions
    docs = _docs(5200)
    vecs = np.concatenate([_subspace(2000, 1, a), _subspace(1100, 2, a), _subspace(2100, 3, b)])
    builder = _builder(docs, vecs)
    first, _ = builder.commit(_entries(builder, docs[:2000]), [], 1, EMB)  # type: ignore[arg-type]
    store_a = first.hnsw
    assert store_a is not None and store_a.basis is not None and store_a.fit_energy > 0.95
    # more of the same kind: kept in the basis as well as the first, no new store
    same, _ = builder.commit(_entries(builder, docs[:3100]), [], 2, EMB)  # type: ignore[arg-type]
    assert same.hnsw is store_a and store_a.added == 1100 and not store_a.drifted(index.BASIS_SLACK)
    # another kind arrives (a quarter and more of the catalog): the basis is fitted on all of it
    other, _ = builder.commit(_entries(builder, docs), [], 3, EMB)  # type: ignore[arg-type]
    assert store_a.added_energy / store_a.added < 0.8  # what it measured for the new vectors
    store_ab = other.hnsw
    assert store_ab is not None and store_ab is not store_a and store_ab.added == 0
    assert "hnsw_rebase_s" in builder.timings
    q = vecs[4000]  # a vector of the new kind: found through the new basis
    pos, _ = rank.dense(other, q, 5, None, None)
    assert other.docs[pos[0]].name == docs[4000].name
    assert store_ab.fit_energy > 0.95  # both kinds in its 24 coordinates


def test_a_short_write_of_the_index_file_is_an_error_not_a_cut_file(tmp_path: Path) -> None:
    """hnswlib does not check its writes: on a full disk (here /dev/full, whose writes fail
    with ENOSPC) save_index returned as if done, the cut file's checksum went into the
    snapshot, and the next start found it corrupt. The store checks the size it wrote."""
    s = HnswStore(DIM, capacity=64)
    s.add(_unit(30, 7))
    with pytest.raises(OSError, match="hnswlib wrote 0 of") as err:
        s.save(Path("/dev/full"))
    assert err.value.errno == 28
    s.save(tmp_path / "ok.idx")  # a disk with room: written whole
    assert (tmp_path / "ok.idx").stat().st_size == s.index.index_file_size()
