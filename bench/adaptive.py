"""Adaptive top-k and abstention (issue 17 item 4) on the held-out sets.

    .venv/bin/python bench/adaptive.py [--sets toollens,mcptoolbenchpp] [--max-k 5]

What a caller who leaves `top_k` out gets, computed exactly as the daemon's SearchService
does (retrieval/adaptive.py: `nothing_fits` on the search's evidence, else `cut` over the
fused scores, at most --max-k): per set, R@auto (recall over what is returned, 0 for an
abstention), the mean number of tools returned, the abstention rate, and R@max-k of the same
ranker for comparison. The constants were calibrated on ToolLens train only; these are the
test split (toollens/queries.jsonl) and MCPToolBench++, never used to tune them. In process,
one query at a time, the default hybrid ranker. Prints JSON (also bench/out/adaptive.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import emit

from toolatlas.evaluation import metrics
from toolatlas.evaluation.datasets import load_catalog, load_queries
from toolatlas.retrieval import adaptive
from toolatlas.retrieval.engine import Engine

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "benchdata"
SETS = {"toollens": ("toollens/catalog.jsonl", "toollens/queries.jsonl"),
        "mcptoolbenchpp": ("mcptoolbenchpp/catalog.jsonl", "mcptoolbenchpp/queries.jsonl")}


def measure(name: str, max_k: int) -> dict[str, Any]:
    catalog, queries_file = SETS[name]
    docs, key_of = load_catalog(DATA / catalog)
    queries = load_queries(DATA / queries_file, key_of)
    # state_dir None: the ONNX export is cached in the user cache dir, as `toolatlas eval` does
    engine = Engine(state_dir=None, cache_size=0, cache_ttl=0, persist=False)
    engine.load()
    if engine.degraded:
        raise SystemExit(f"bench/adaptive.py: the embedder did not load: {engine.stats()['embedder_error']}")
    engine.update(docs, [])
    r_auto = r_max = returned = 0.0
    abstained = no_evidence = 0
    t0 = time.perf_counter()
    for q in queries:
        out = engine.search(q.text, max_k)
        ranked = [h.name for h in out.hits]
        r_max += metrics.recall_at(ranked, q.relevant, max_k)
        if out.evidence is None:  # the daemon gives max_k then (BM25 alone is not calibrated)
            no_evidence += 1
            shown = ranked
        elif adaptive.nothing_fits(*out.evidence):
            abstained += 1
            shown = []
        else:
            shown = ranked[: adaptive.cut([h.score for h in out.hits], max_k)]
        returned += len(shown)
        r_auto += metrics.recall_at(shown, q.relevant, max_k)
    n = max(len(queries), 1)
    return {
        "tools": len(docs), "queries": len(queries),
        "recall@auto": round(r_auto / n, 4), "mean_returned": round(returned / n, 3),
        f"recall@{max_k}": round(r_max / n, 4), "abstained": abstained,
        "abstained_pct": round(100.0 * abstained / n, 2), "without_evidence": no_evidence,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="toollens,mcptoolbenchpp")
    p.add_argument("--max-k", type=int, default=5)
    a = p.parse_args()
    unknown = [s for s in a.sets.split(",") if s not in SETS]
    if unknown:
        p.error(f"unknown set(s) {', '.join(unknown)}; expected {', '.join(SETS)}")
    load = [round(x, 2) for x in os.getloadavg()]
    rows = {s: measure(s, a.max_k) for s in a.sets.split(",")}
    emit({"bench": "adaptive", "gap": adaptive.GAP, "cos_floor": adaptive.COS_FLOOR,
          "cover_floor": adaptive.COVER_FLOOR, "max_k": a.max_k, "loadavg_start": load, "sets": rows}, "adaptive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
