"""Rift on both dev sets: cluster counts by risk, wall time of the full CLI run, JSON out.

    .venv/bin/python bench/rift_report.py [--embedder onnx|torch] [--sets toollens,mcptoolbenchpp]

For each set it runs `python -m toolatlas rift --catalog ... --json --fail-on never` as a
fresh process (so the time includes imports and loading the model) for: the publisher's
text, the text bootstrap cards give, and the ablation without margin analysis. A planted
duplicates check (three MCPToolBench++ tools copied to a server "mirror") must come out HIGH
with REGENERATE. Goal (issue 4): the toollens full run < 30 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit

ROOT = Path(__file__).resolve().parents[1]
BENCHDATA = ROOT / ".." / "shared" / "benchdata"


def run(catalog: Path, *extra: str, embedder: str) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "toolatlas", "rift", "--catalog", str(catalog), "--json", "--fail-on", "never", "--embedder", embedder, *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout), wall


def brief(js: dict, wall: float) -> dict:
    return {
        "tools": js["tools"],
        "clusters": len(js["clusters"]),
        "clustered_tools": js["clustered_tools"],
        "counts": js["counts"],
        "regenerate": len(js["regenerate"]),
        "wall_s": round(wall, 2),
        "analysis_s": js["seconds"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--embedder", default="onnx")
    ap.add_argument("--sets", default="toollens,mcptoolbenchpp")
    args = ap.parse_args()
    result: dict = {"embedder": args.embedder, "sets": {}}
    # warm-up: the first onnx use may export the model once (cached afterwards)
    run(BENCHDATA / "mcptoolbenchpp" / "catalog.jsonl", "--no-margin", embedder=args.embedder)
    for name in args.sets.split(","):
        cat = BENCHDATA / name / "catalog.jsonl"
        entry = {}
        for label, extra in (("publisher", ()), ("bootstrap", ("--generator", "bootstrap")), ("no_margin", ("--no-margin",))):
            js, wall = run(cat, *extra, embedder=args.embedder)
            entry[label] = brief(js, wall)
        result["sets"][name] = entry

    from toolatlas.catalog.catalog_file import read_catalog

    rows = [line.raw for line in read_catalog(BENCHDATA / "mcptoolbenchpp" / "catalog.jsonl")]
    picks = [r for r in rows if r["name"] in ("read_file", "tavily-search", "playwright_navigate")]
    with tempfile.TemporaryDirectory() as tmp:
        planted = Path(tmp) / "planted.jsonl"
        planted.write_text("".join(json.dumps(r) + "\n" for r in rows + [dict(r, server="mirror") for r in picks]))
        js, wall = run(planted, embedder=args.embedder)
        abl, _ = run(planted, "--no-margin", embedder=args.embedder)
    member = {m["name"]: (c["risk"], m["diagnosis"]) for c in js["clusters"] for m in c["members"]}
    checks = {f"mirror copy of {r['name']}": member.get(f"mirror__{r['name']}") for r in picks}
    result["planted_duplicates"] = {
        "found": {k: list(v) if v else None for k, v in checks.items()},
        "all_high_regenerate": all(v == ("high", "REGENERATE") for v in checks.values()),
        "ablation_counts": abl["counts"],
    }
    tl = result["sets"].get("toollens", {}).get("publisher", {}).get("wall_s")
    result["toollens_under_30s"] = tl is not None and tl < 30
    emit(result, "rift_report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
