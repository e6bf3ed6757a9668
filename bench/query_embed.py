"""How long the default embedder takes to embed one query, and how close its int8 query
vectors are to the fp32 ones: the part of a tool_search miss that the model costs.

    python bench/query_embed.py [--queries 300] [--rounds 2]

The search_latency bench queries (ToolLens + MCPToolBench++, distinct), one at a time through
`OnnxEmbedder.embed_queries` (tokenizer, model, pooling) of the default "onnx" embedder from
the user cache's export: on the lone-query session (two spinning threads, what a search
waits on while searches do not overlap) and on the one-thread session (concurrent
searches), then medians by query length in tokens, and the cosine of each int8 query vector
to its fp32 vector. Prints JSON and writes bench/out/query_embed.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "daemon"))

from _common import emit, median, summary  # noqa: E402
from toolatlas.evaluation.metrics import percentile  # noqa: E402
from search_latency import bench_queries  # noqa: E402
from toolatlas.retrieval.embed import _EXPORT_DIRNAME, OnnxEmbedder, ensure_onnx_export  # noqa: E402

BUCKETS = [(0, 16), (16, 32), (32, 48), (48, 64), (64, 257)]


def _timed(emb: OnnxEmbedder, queries: list[str], rounds: int) -> list[list[float]]:
    """Seconds per query per round, each query embedded alone."""
    out = []
    for _ in range(rounds):
        times = []
        for q in queries:
            t = time.perf_counter()
            emb.embed_queries([q])
            times.append(time.perf_counter() - t)
        out.append(times)
    return out


def run(n_queries: int, rounds: int) -> dict[str, Any]:
    folder = ensure_onnx_export(None)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    queries = bench_queries(n_queries)
    lone = OnnxEmbedder(folder, "fp32", "int8", query_threads=2)
    one = OnnxEmbedder(folder, "fp32", "int8", query_threads=1)
    fp32 = OnnxEmbedder(folder, "fp32", "fp32")
    for q in queries[:20]:  # warm both sessions: one query at a time, as they are timed
        lone.embed_queries([q])
        one.embed_queries([q])
    tokens = np.array([len(lone._tok.encode(q).ids) for q in queries])
    report: dict[str, Any] = {
        "export": _EXPORT_DIRNAME,
        "fusion": manifest.get("fusion"),
        "queries": len(queries),
        "tokens": {"median": int(median(tokens.tolist())), "p95": int(percentile(tokens.tolist(), 95)), "max": int(tokens.max())},
        "rounds": rounds,
    }
    before = lone.lone_queries
    for label, emb in (("lone_query_2_spinning_threads", lone), ("one_thread", one)):
        per_round = _timed(emb, queries, rounds)
        entry: dict[str, Any] = {"rounds": [summary(r) for r in per_round]}
        last = np.array(per_round[-1]) * 1000
        entry["median_ms_by_tokens"] = {
            f"{lo}-{hi - 1}": {"n": int(m.sum()), "median_ms": round(float(median(last[m].tolist())), 3)}
            for lo, hi in BUCKETS
            if (m := (tokens >= lo) & (tokens < hi)).any()
        }
        report[label] = entry
    report["lone_session_used"] = lone.lone_queries - before == rounds * len(queries)
    cos = (lone.embed_queries(queries) * fp32.embed_queries(queries)).sum(axis=1)
    report["int8_vs_fp32_cosine"] = {"mean": round(float(cos.mean()), 4), "min": round(float(cos.min()), 4)}
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    emit(run(args.queries, args.rounds), "query_embed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
