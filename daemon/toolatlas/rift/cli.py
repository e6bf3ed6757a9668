"""`toolatlas rift (--config PATH | --catalog FILE) [--json] [--fail-on high|medium|never]`.

With --config the tools come from the live upstreams through the cards (what the daemon would
index: card text for attested tools, publisher text for unattested ones, quarantined tools
left out). With --catalog they come from a catalog JSONL file; `--generator bootstrap` scores
the text bootstrap cards would give instead of the publisher's.

Exit codes: 0 no cluster at or above --fail-on (default high), 1 one exists, 2 usage,
3 an upstream could not be listed, 78 config error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from toolatlas.catalog.cards_cli import listing_seconds
from toolatlas.rift.inputs import InputRow, build_inputs, catalog_rows

EX_FOUND = 1
EX_USAGE = 2
EX_UPSTREAM = 3
EX_CONFIG = 78


def _from_config(cfg: Any, timeout: float | None) -> tuple[list[InputRow], int]:
    from toolatlas.catalog.attest import Attestor
    from toolatlas.catalog.cards_cli import list_live

    att = Attestor(cfg, write=False)  # a report: it re-attests in memory, never over the daemon's cards
    rows: list[InputRow] = []
    quarantined = 0
    for up in cfg.upstream:
        if not up.enabled:
            continue
        recs = list_live(up, timeout)
        res = att.attest(up.name, recs)
        quarantined += len(res.quarantined)
        for r in recs:
            if r.tool in res.texts:
                summary, server_summary, tags = res.texts[r.tool]
                rows.append((r, summary, server_summary, tags))
    return rows, quarantined


def _clusters_shown(text: str) -> int:
    """--limit: a whole number >= 0 (a negative one cut the report from the end and printed
    a wrong count of clusters left out); argparse makes the error a usage error, exit 2."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def main(argv: list[str]) -> int:
    """`toolatlas rift ...` (argv after "rift")."""
    p = argparse.ArgumentParser(prog="toolatlas rift", description="Report tools the index cannot tell apart.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="live upstreams through their cards")
    src.add_argument("--catalog", help="catalog JSONL file")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--fail-on", choices=["high", "medium", "never"], default=None,
                   help="exit 1 if a cluster at or above this risk exists (default high; never with --no-margin)")
    p.add_argument("--theta", type=float, default=0.65, help="cluster similarity threshold (default 0.65)")
    p.add_argument("--high", type=float, default=0.10, help="worst margin below this is HIGH (default 0.10)")
    p.add_argument("--medium", type=float, default=0.20, help="worst margin below this is MEDIUM (default 0.20)")
    p.add_argument("--no-margin", action="store_true", help="ablation: clusters only, no margin analysis (no risk labels)")
    p.add_argument("--generator", choices=["publisher", "bootstrap"], default="publisher", help="with --catalog: which text to analyse")
    p.add_argument("--embedder", choices=["onnx", "onnx-int8", "onnx-fp32", "torch"], help="default: the config's, else onnx")
    p.add_argument("--limit", type=_clusters_shown, default=30, help="clusters shown in the text report")
    p.add_argument("--timeout", type=listing_seconds, help="seconds per upstream listing")
    args = p.parse_args(argv)
    if args.no_margin and args.fail_on in ("high", "medium"):  # its clusters are unrated: the gate could never fail
        p.error(f"--no-margin leaves clusters without a risk, so --fail-on {args.fail_on} could never fail; "
                "drop one of them")
    args.fail_on = args.fail_on or ("never" if args.no_margin else "high")

    from toolatlas.catalog.catalog_file import CatalogFileError
    from toolatlas.errors import ConfigError, ToolatlasError

    t_start = time.perf_counter()
    cfg = None
    quarantined = 0
    try:
        if args.config:
            from toolatlas import config

            cfg = config.load(args.config)
            rows, quarantined = _from_config(cfg, args.timeout)
        else:
            rows = catalog_rows(args.catalog, args.generator)
    except ConfigError as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return EX_CONFIG
    except (ValueError, OSError, CatalogFileError) as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return EX_USAGE
    except ToolatlasError as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return EX_UPSTREAM

    if not rows:  # a gate must not pass over nothing (every tool quarantined: cards required, none yet)
        why = (f"all {quarantined} tool(s) of the upstreams are quarantined (`toolatlas cards generate` writes "
               "their cards)" if quarantined else "the enabled upstreams list no tools")
        print(f"toolatlas: no tool to analyse: {why}", file=sys.stderr)
        return EX_USAGE
    kind = args.embedder or (cfg.search.embedder if cfg and cfg.search.embedder != "none" else "onnx")
    from pathlib import Path

    from toolatlas.retrieval.embed import get_embedder
    from toolatlas.rift.report import analyse

    try:
        embedder = get_embedder(kind, Path(cfg.daemon.state_dir) if cfg else None)
    except ToolatlasError as exc:
        print(f"toolatlas: cannot load the embedder: {exc}", file=sys.stderr)
        return EX_USAGE
    tools, schemas, token_texts = build_inputs(rows)
    try:
        report = analyse(
            tools, embedder, theta=args.theta, high=args.high, medium=args.medium,
            margin=not args.no_margin, schemas=schemas, token_texts=token_texts,
        )
    except ValueError as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return EX_USAGE
    total = time.perf_counter() - t_start
    if args.json:
        out = report.to_json()
        out["seconds"]["total"] = round(total, 3)
        out["source"] = args.config or args.catalog
        out["text"] = args.generator if args.catalog else "cards"
        if args.config:
            out["quarantined_tools"] = quarantined
        print(json.dumps(out, ensure_ascii=True))  # tool text is anyone's: nothing raw reaches a terminal
    else:
        print(report.format_text(limit=args.limit))
        if quarantined:
            print(f"\n({quarantined} quarantined tool(s) left out; see `toolatlas status`)")
        print(f"\n{total:.1f} s")
    return EX_FOUND if args.fail_on != "never" and report.fails(args.fail_on) else 0
