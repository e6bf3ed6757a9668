"""`toolatlas eval`: offline retrieval evaluation through the same Engine the daemon serves.

    toolatlas eval --catalog FILE --queries FILE [--k 1,3,5,10] [--mode MODE|all] [--json]
                   [--embedder onnx|torch|onnx-int8|onnx-fp32] [--state-dir DIR] [--feedback FILE]

`--feedback FILE` (queries.jsonl format, optional "principal" per line) is replayed into a
fresh learned state first: mode `learned` (also in `--mode all`) ranks with it, through the
same code as the daemon's ranker; without it `learned` is the zero-shot hybrid. With it the
default mode is `learned`, and a `--mode` that does not rank with it is a usage error (its
figures would be zero-shot ones printed beside the feedback's event count).

Each metric@K comes from a search with top_k=K (what a caller asking for K results gets);
MRR from one search ranking the whole catalog. Latencies (p50/p95, ms) are those of the
top_k=max(K) search, query cache disabled, query embedding included.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from toolatlas.evaluation.run import ALL_MODES, evaluate


def _parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k must be comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"--k values must be >= 1, got {text!r}")
    return ks


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toolatlas eval", description="Offline retrieval evaluation.")
    p.add_argument("--catalog", required=True, type=Path, help="catalog.jsonl")
    p.add_argument("--queries", required=True, type=Path, help="queries.jsonl")
    p.add_argument("--k", default=[1, 3, 5, 10], type=_parse_ks, help="cut-offs, e.g. 1,3,5,10")
    p.add_argument("--mode", default=None, choices=[*ALL_MODES, "all"],
                   help="ranker to evaluate, or all (default: hybrid; learned with --feedback)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--embedder", default="onnx", choices=["onnx", "torch", "onnx-int8", "onnx-fp32"], help="embedding runtime"
    )
    p.add_argument("--fusion", default="z", choices=["z", "minmax", "rrf"], help="hybrid fusion (z is the default ranker; rrf the baseline)")
    p.add_argument("--feedback", type=Path, default=None,
                   help="queries.jsonl whose relevant tools count as executed (usage events) for mode learned")
    p.add_argument("--state-dir", type=Path, default=None, help="where the ONNX export is cached (default: user cache)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from toolatlas.errors import ToolatlasError
    from toolatlas.evaluation.datasets import load_catalog, load_queries, resolved_events, unresolved_warning
    from toolatlas.retrieval.engine import DENSE_MODES, Engine

    mode = args.mode or ("learned" if args.feedback is not None else "hybrid")
    modes = list(ALL_MODES) if mode == "all" else [mode]
    try:
        docs, key_of = load_catalog(args.catalog)
        queries = load_queries(args.queries, key_of)
        feedback = load_queries(args.feedback, key_of) if args.feedback is not None else []
    except ToolatlasError as exc:
        print(f"toolatlas eval: {exc}", file=sys.stderr)
        return 2
    for path, batch in ((args.queries, queries), (args.feedback, feedback)):
        if path is not None and not batch:  # an empty --feedback would quietly rank zero-shot
            print(f"toolatlas eval: {path}: holds no queries (one JSON object a line, "
                  '{"query": ..., "relevant": [{"server": ..., "name": ...}]})', file=sys.stderr)
            return 2
    if args.feedback is not None and mode not in ("learned", "all"):
        print(f"toolatlas eval: --feedback is replayed for mode learned only; --mode {mode} would ignore it "
              "(use --mode learned or --mode all)", file=sys.stderr)
        return 2
    for path, batch in ((args.queries, queries), (args.feedback, feedback)):
        warning = unresolved_warning(path, batch, feedback=batch is feedback)
        if warning:
            print(f"toolatlas eval: warning: {warning}", file=sys.stderr)
    events = resolved_events(feedback)
    if feedback and not events:  # a feedback file for another catalog: learned would quietly rank zero-shot
        print(f"toolatlas eval: {args.feedback}: none of its lines names a tool of {args.catalog}, so there is "
              "no usage event to replay (is it for another catalog?)", file=sys.stderr)
        return 2
    needs_dense = any(m in DENSE_MODES for m in modes)
    engine = Engine(
        state_dir=args.state_dir,
        embedder=args.embedder if needs_dense else "none",
        cache_size=0,
        cache_ttl=0,
        persist=False,  # the state dir only caches the ONNX export here
        fusion=args.fusion,
    )
    engine.load()
    if needs_dense and engine.degraded:
        print(f"toolatlas eval: the {args.embedder} embedder failed to load: {engine.stats()['embedder_error']}", file=sys.stderr)
        return 1
    engine.update(docs, [])
    if feedback:
        from toolatlas.evaluation.feedback import replay

        replay(engine, feedback, known=frozenset(d.name for d in docs))
    result: dict[str, Any] = {
        "tools": len(docs),
        "queries": len(queries),
        "embedder": engine.stats()["embedder"],
        "query_embedder": engine.stats()["query_embedder"],
        "fusion": args.fusion,
        "feedback_events": events,
        "modes": evaluate(engine, queries, modes, args.k),
    }
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result, args.k)
    return 0


def _print_table(result: dict[str, Any], ks: list[int]) -> None:
    cols = [f"recall@{k}" for k in ks] + [f"ndcg@{k}" for k in ks] + ["mrr", "p50_ms", "p95_ms"]
    print(f"{result['tools']} tools, {result['queries']} queries, embedder {result['embedder']}"
          + (f" (queries: {result['query_embedder']})" if result.get('query_embedder') not in (None, result['embedder']) else ""))
    print(f"{'mode':<10} " + " ".join(f"{c:>9}" for c in cols))
    for mode, row in result["modes"].items():
        print(f"{mode:<10} " + " ".join(f"{row[c]:>9.4f}" if "ms" not in c else f"{row[c]:>9.2f}" for c in cols))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
