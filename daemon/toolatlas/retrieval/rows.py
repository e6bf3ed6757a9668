"""A large snapshot's vectors as 16-bit integers with a float32 scale per row (issue 19 item 3).

At 100,000 tools the snapshot's float32 rows were the daemon's largest array (154 MB); as
int16 they take half. Each row is divided by its largest magnitude over 32767, so an element
is off by at most max|x| / 65534 and a cosine by ~1e-5 (float16: ~4e-5). Scoring converts the
rows with numpy's SIMD integer cast, a chunk at a time into one float32 buffer; numpy casts
float16 at 1.2-2 ns an element here, which made float16 rows cost a scoped scan 2.5x
(bench/README.md, stop 38). bench/vector_dtype.py at 20,000 tools: hybrid ranking 0.97x the
float32 time unscoped, 0.90x over one server's 4,000 rows, the same top 5 for 300 of 300
queries (stop 47).
"""

from __future__ import annotations

import numpy as np

CHUNK = 8192  # rows converted at a time: a scan never holds a float32 copy of the matrix


def quantize(vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int16 rows, float32 scale per row) of float32 `vecs`."""
    peak = np.abs(vecs).max(axis=1) if vecs.shape[1] else np.zeros(vecs.shape[0], np.float32)
    scale = np.where(peak > 0, peak / 32767.0, 1.0).astype(np.float32)
    return np.rint(vecs / scale[:, None]).astype(np.int16), scale


def take(mat: np.ndarray, scales: np.ndarray | None, pos: np.ndarray | None = None) -> np.ndarray:
    """The float32 vectors at positions `pos` (None: all) of `mat` (float32, or int16 with `scales`)."""
    got = mat if pos is None else mat[pos]
    if scales is None:
        return got
    out: np.ndarray = got.astype(np.float32)
    out *= (scales if pos is None else scales[pos])[:, None]
    return out


def sims(mat: np.ndarray, scales: np.ndarray | None, qvec: np.ndarray, pos: np.ndarray | None = None) -> np.ndarray:
    """Dot products (float32) of `qvec` with the rows at `pos` (None: all)."""
    if scales is None:
        got: np.ndarray = (mat if pos is None else mat[pos]) @ qvec
        return got
    n = mat.shape[0] if pos is None else pos.shape[0]
    out = np.empty(n, dtype=np.float32)
    buf = np.empty((min(n, CHUNK), mat.shape[1]), dtype=np.float32)
    for s in range(0, n, CHUNK):
        part = mat[s : s + CHUNK] if pos is None else mat[pos[s : s + CHUNK]]
        conv = buf[: part.shape[0]]
        np.copyto(conv, part, casting="unsafe")
        np.matmul(conv, qvec, out=out[s : s + part.shape[0]])
    out *= scales if pos is None else scales[pos]
    return out


__all__ = ["CHUNK", "quantize", "sims", "take"]
