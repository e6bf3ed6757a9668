"""Every retrieval-quality figure of issue 3 in one run (the same code as `toolatlas eval`).

    python bench/eval_report.py [--embedders onnx,onnx-int8,onnx-fp32,torch] [--sets toollens,mcptoolbenchpp]

For each dev set (toollens = the 1,877 test queries; tuning used queries-train.jsonl only):
all modes with the default embedder, the RRF baseline (k=60, 3x over-fetch), and the default
ranker's nDCG@5 per embedder runtime (the quality rule: within 0.005 of torch). Prints JSON
and writes bench/out/eval_report.json. Each figure is also reproducible with one command,
printed next to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "daemon"))

from _common import emit  # noqa: E402
from toolatlas.evaluation.run import ALL_MODES, evaluate  # noqa: E402
from toolatlas.evaluation.datasets import benchdata_dir, load_catalog, load_queries  # noqa: E402
from toolatlas.retrieval.embed import ONNX_PRECISIONS  # noqa: E402
from toolatlas.retrieval.engine import Engine  # noqa: E402

KS = [1, 3, 5, 10]


def _cmd(ds: str, extra: str) -> str:
    return (
        f"toolatlas eval --catalog ../shared/benchdata/{ds}/catalog.jsonl "
        f"--queries ../shared/benchdata/{ds}/queries.jsonl --json {extra}".strip()
    )


def run(sets: list[str], embedders: list[str]) -> dict[str, Any]:
    report: dict[str, Any] = {"default_onnx_precisions": dict(zip(("documents", "queries"), ONNX_PRECISIONS["onnx"])), "sets": {}}
    for ds in sets:
        docs, key_of = load_catalog(benchdata_dir() / ds / "catalog.jsonl")
        queries = load_queries(benchdata_dir() / ds / "queries.jsonl", key_of)
        entry: dict[str, Any] = {"tools": len(docs), "queries": len(queries)}
        eng = Engine(state_dir=None, cache_size=0, persist=False)
        eng.update(docs, [])
        entry["modes"] = evaluate(eng, queries, list(ALL_MODES), KS)
        entry["modes_command"] = _cmd(ds, "--mode all")
        rrf = Engine(state_dir=None, cache_size=0, persist=False, fusion="rrf")
        rrf.update(docs, [])
        entry["rrf_baseline"] = evaluate(rrf, queries, ["hybrid"], [5])["hybrid"]
        entry["rrf_command"] = _cmd(ds, "--mode hybrid --k 5 --fusion rrf")
        entry["embedders"] = {}
        for kind in embedders:
            e = Engine(state_dir=None, cache_size=0, persist=False, embedder=kind)
            e.update(docs, [])
            row = evaluate(e, queries, ["hybrid", "dense"], [5])
            entry["embedders"][kind] = {
                "name": e.stats()["embedder"],
                "query_name": e.stats()["query_embedder"],
                "hybrid": row["hybrid"],
                "dense": row["dense"],
                "command": _cmd(ds, f"--mode hybrid --k 5 --embedder {kind}"),
            }
            print(f"{ds} {kind}: {json.dumps(entry['embedders'][kind])}", file=sys.stderr, flush=True)
        if "torch" in entry["embedders"]:
            ref = entry["embedders"]["torch"]["hybrid"]["ndcg@5"]
            entry["ndcg5_delta_vs_torch"] = {
                k: round(v["hybrid"]["ndcg@5"] - ref, 4) for k, v in entry["embedders"].items()
            }
        report["sets"][ds] = entry
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sets", default="toollens,mcptoolbenchpp")
    p.add_argument("--embedders", default="onnx,onnx-int8,onnx-fp32,torch")
    args = p.parse_args(argv)
    emit(run(args.sets.split(","), [e for e in args.embedders.split(",") if e]), "eval_report")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
