"""One evaluation run: every query through an Engine, metrics averaged per mode.

The library behind `toolatlas eval` (evaluation/cli.py) and bench/eval_report.py; it lives
here, not in the CLI module, because no library code may live in (or import) a CLI module.
"""

from __future__ import annotations

import time

from toolatlas.evaluation import metrics
from toolatlas.evaluation.datasets import Query
from toolatlas.evaluation.feedback import EVAL_PRINCIPAL
from toolatlas.retrieval.engine import MODES, Engine

ALL_MODES = MODES  # hybrid (the zero-shot ranker), bm25, dense, two-stage, keyword, learned


def evaluate(engine: Engine, queries: list[Query], modes: list[str], ks: list[int]) -> dict[str, dict[str, float]]:
    """Mean metrics per mode: recall@K, ndcg@K, hit@K, mrr, p50_ms, p95_ms."""
    out: dict[str, dict[str, float]] = {}
    n_all = len(engine)
    kmax = max(ks)
    for mode in modes:
        sums: dict[str, float] = {}
        lat: list[float] = []
        for q in queries:
            t0 = time.perf_counter()
            res = engine.search(q.text, kmax, mode=mode, principal=EVAL_PRINCIPAL)
            lat.append((time.perf_counter() - t0) * 1000.0)
            for k in ks:
                ranked = [h.name for h in (res if k == kmax else engine.search(q.text, k, mode=mode, principal=EVAL_PRINCIPAL)).hits]
                for metric, fn in (("recall", metrics.recall_at), ("ndcg", metrics.ndcg_at), ("hit", metrics.hit_at)):
                    key = f"{metric}@{k}"
                    sums[key] = sums.get(key, 0.0) + fn(ranked, q.relevant, k)
            full = [h.name for h in engine.search(q.text, max(n_all, 1), mode=mode, principal=EVAL_PRINCIPAL).hits]
            sums["mrr"] = sums.get("mrr", 0.0) + metrics.reciprocal_rank(full, q.relevant)
        n = max(len(queries), 1)
        row = {key: round(v / n, 4) for key, v in sums.items()}
        ordered: dict[str, float] = {}
        for metric in ("recall", "ndcg", "hit"):
            for k in ks:
                ordered[f"{metric}@{k}"] = row.get(f"{metric}@{k}", 0.0)
        ordered["mrr"] = row.get("mrr", 0.0)
        ordered["p50_ms"] = round(metrics.percentile(lat, 50), 3)
        ordered["p95_ms"] = round(metrics.percentile(lat, 95), 3)
        out[mode] = ordered
    return out
