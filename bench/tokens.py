"""Token figures: the full tools/list of a catalog vs toolatlas's three meta-tools.

Counts the JSON an MCP client would receive for `tools/list` with the local
anthropic-tokenizer (see `toolatlas.tokens`), and the mean size of a top-5 `tool_search`
result. Prints one JSON object.

Issue 18's budget (`meta_tools` and `dev_sets` in the output): the meta-tool definitions with
the templates in force (`--templates DIR`, default the shipped ones) rendered for a 20-server
domain list (the 20 largest benchdata servers, their bootstrap-card tags), against 400 tokens;
and per dev set the mean tokens of a top-5 answer as tool_search builds it (gateway.matches:
sanitized publisher text; with examples: carded matches whose card has the bootstrap summary
and 2 example phrasings, ToolLens's from its train split, MCPToolBench++'s from its other
queries, shown as a match bounds them (gateway.matches.shown_examples), and a provenance as
a real card carries it: a key_id of a real Ed25519 key and a created_at to the second), in
json and compact form, against 600 (json with examples, ToolLens) and half of json (compact).

Run (from the repo root):

    .venv/bin/python bench/tokens.py                      # 2,000 tools from the benchdata catalogs
    .venv/bin/python bench/tokens.py --tools 500 --tools 2000 --tools 10000
    .venv/bin/python bench/tokens.py --catalog my.jsonl   # any catalog.jsonl (interface format)
    .venv/bin/python bench/tokens.py --config conf/example.toml   # list the config's live upstreams
    .venv/bin/python bench/tokens.py --breakdown          # and where a carded answer's tokens go

Catalog mode: the default catalog is ToolLens (464 RapidAPI tools) + MCPToolBench++ (49 real
MCP tools) from ../shared/benchdata, replicated with varied server names until it holds N
tools (copy k of server `s` becomes `s-k`; descriptions and schemas stay as published).
Top-5 results are built from the test queries' relevant tools (filled up to 5 from the
catalog, no tool twice) in the interface's result shape: this measures what a result costs, not ranking.

Config mode connects to each upstream once (stdio ones are spawned; sse/http ones must be
running, e.g. via `make run`), lists its tools, and reports the figures for that catalog;
unreachable upstreams are listed under "unreachable".
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHDATA = ROOT / ".." / "shared" / "benchdata"
DEFAULT_CATALOGS = [BENCHDATA / "toollens" / "catalog.jsonl", BENCHDATA / "mcptoolbenchpp" / "catalog.jsonl"]
DEFAULT_QUERIES = BENCHDATA / "toollens" / "queries.jsonl"
SAMPLE_QUERIES = 50

sys.path.insert(0, str(ROOT / "daemon"))

from toolatlas.catalog.catalog_file import CatalogLine, read_catalog, read_json_lines  # noqa: E402
from toolatlas.names import namespaced  # noqa: E402
from toolatlas.tokens import TOKENIZER_NAME, catalog_token_report  # noqa: E402


def load_meta_tools(templates: str | None = None, environment: str = "production") -> tuple[list[dict[str, Any]], str]:
    """The meta-tool definitions the gateway serves (templates rendered, no servers named),
    and where they came from."""
    from toolatlas.guidance import Guidance

    guidance = Guidance.load(templates, environment)
    meta = guidance.meta_tools(guidance.values(servers=[], domains=[], tool_count=0))
    return [dict(t) for t in meta.tools], f"toolatlas.guidance ({templates or 'shipped templates'})"


def slug(server: str) -> str:
    """A benchdata server name as a valid upstream name ([a-z0-9][a-z0-9-]*)."""
    s = re.sub(r"[^a-z0-9]+", "-", server.lower()).strip("-")
    return (s or "server")[:40]


def read_queries(path: Path) -> list[dict[str, Any]]:
    return [obj for _, obj in read_json_lines(path)]


def mcp_tool(server: str, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": namespaced(server, name), "description": description, "inputSchema": schema}


def replicate(records: list[CatalogLine], n: int) -> list[dict[str, Any]]:
    """`n` MCP tool dicts cycling over `records`, copy k of server s renamed s-k."""
    tools = []
    for i in range(n):
        rec = records[i % len(records)]
        copy = i // len(records)
        server = slug(rec.server) + (f"-{copy}" if copy else "")
        tools.append(mcp_tool(server, rec.name, rec.description, rec.input_schema or {"type": "object"}))
    return tools


def top5(query: dict[str, Any], by_key: dict[tuple[str, str], CatalogLine], records: list[CatalogLine],
         rnd: random.Random) -> list[CatalogLine]:
    """The catalog lines of a top-5 answer to `query`: its relevant tools, then others drawn
    from `records`; each tool once, as tool_search answers (a query may name one twice)."""
    keys = list(dict.fromkeys((r["server"], r["name"]) for r in query.get("relevant", [])))
    recs = [by_key[k] for k in keys if k in by_key][:5]
    if len(by_key) < 5:
        return recs
    while len(recs) < 5:
        rec = rnd.choice(records)
        if all(rec is not r for r in recs):
            recs.append(rec)
    return recs


def sample_results(records: list[CatalogLine], queries: list[dict[str, Any]], seed: int = 1) -> list[dict[str, Any]]:
    """Top-5 tool_search result objects for sampled queries (relevant tools first)."""
    by_key = {(r.server, r.name): r for r in records}
    rnd = random.Random(seed)
    picked = rnd.sample(queries, min(SAMPLE_QUERIES, len(queries))) if queries else [{"query": "", "relevant": []}] * SAMPLE_QUERIES
    results = []
    for q in picked:
        recs = top5(q, by_key, records, rnd)
        matches = []
        for rank, r in enumerate(recs):
            t = mcp_tool(slug(r.server), r.name, r.description, r.input_schema or {"type": "object"})
            matches.append({"name": t["name"], "server": slug(r.server), "tool": r.name,
                            "description": t["description"], "inputSchema": t["inputSchema"],
                            "score": round(1.0 / (rank + 1), 4)})
        results.append({"query": q["query"], "matches": matches, "degraded": None})
    return results


def catalog_mode(args: argparse.Namespace, meta: list[dict[str, Any]]) -> dict[str, Any]:
    paths = [Path(p) for p in args.catalog] if args.catalog else DEFAULT_CATALOGS
    records = [r for p in paths for r in read_catalog(p)]
    queries = read_queries(Path(args.queries)) if args.queries else (read_queries(DEFAULT_QUERIES) if not args.catalog else [])
    samples = sample_results(records, queries)
    sizes = args.tools or [2000]
    runs = []
    for n in sizes:
        t0 = time.perf_counter()
        report = catalog_token_report(replicate(records, n), meta, samples)
        report["count_seconds"] = round(time.perf_counter() - t0, 3)
        report["tokens_per_tool"] = round(report["full_catalog_tokens"] / max(n, 1), 1)
        runs.append(report)
    return {"source_catalogs": [str(p.resolve()) for p in paths], "source_tools": len(records), "runs": runs}


def config_mode(args: argparse.Namespace, meta: list[dict[str, Any]]) -> dict[str, Any]:
    import anyio

    from toolatlas.config import load
    from toolatlas.upstream.pool import list_tools_once

    cfg = load(args.config)
    tools: list[dict[str, Any]] = []
    per_upstream: dict[str, int] = {}
    unreachable: dict[str, str] = {}

    async def main() -> None:
        for up in cfg.upstream:
            if not up.enabled:
                continue
            try:
                listed = await list_tools_once(up, timeout=args.timeout)
            except Exception as exc:  # noqa: BLE001 - a bench reports, it does not stop
                unreachable[up.name] = str(exc)
                continue
            per_upstream[up.name] = len(listed)
            for t in listed:
                # Exactly what a passthrough tools/list would carry, under the namespaced name.
                d = t.model_dump(mode="json", by_alias=True, exclude_none=True)
                d["name"] = namespaced(up.name, t.name)
                tools.append(d)

    anyio.run(main)
    # Top-5 samples from the live tools themselves: every window of 5 (at most 50).
    samples = []
    for i in range(0, max(len(tools) - 4, 0), 5)[:SAMPLE_QUERIES]:
        window = tools[i:i + 5]
        samples.append({"query": "", "matches": [
            {"name": t["name"], "server": t["name"].split("__")[0], "tool": t["name"].split("__", 1)[1],
             "description": t.get("description", ""), "inputSchema": t.get("inputSchema", {}), "score": 0.5}
            for t in window
        ], "degraded": None})
    report = catalog_token_report(tools, meta, samples or None)
    return {"config": str(Path(args.config).resolve()), "upstreams": per_upstream,
            "unreachable": unreachable, "runs": [report]}


def _domains(records: list[CatalogLine], n: int = 20) -> list[Any]:
    """The `n` servers with most tools, as {domains} shows them: bootstrap-card tags."""
    from collections import Counter

    from toolatlas.catalog.generators import BootstrapGenerator
    from toolatlas.catalog.model import ToolRecord
    from toolatlas.guidance import Domain

    top = [s for s, _ in Counter(slug(r.server) for r in records).most_common(n)]
    out = []
    for server in top:
        recs = [ToolRecord.make(server, r.name, r.description, r.input_schema) for r in records if slug(r.server) == server]
        draft = BootstrapGenerator().generate(server, recs)
        out.append(Domain(server, draft.summary, draft.tags))
    return out


def meta_budget(records: list[CatalogLine], templates: str | None, environment: str) -> dict[str, Any]:
    from toolatlas.guidance import Guidance
    from toolatlas.tokens import count_tokens, tools_list_json

    guidance = Guidance.load(templates, environment)
    domains = _domains(records)
    values = guidance.values(servers=[d.server for d in domains], domains=domains, tool_count=len(records))
    meta = guidance.meta_tools(values)
    return {"templates": templates or "shipped defaults", "environment": environment, "servers": len(domains),
            "tokens": count_tokens(tools_list_json([dict(t) for t in meta.tools])), "target": 400,
            "domains": values["domains"]}


def _examples(queries: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """Per tool, the three shortest queries that name it relevant: what an operator writes as
    example phrasings is short, and a train query is a real phrasing."""
    out: dict[tuple[str, str], list[str]] = {}
    for q in sorted(queries, key=lambda q: len(q["query"])):
        for r in q.get("relevant", []):
            got = out.setdefault((r["server"], r["name"]), [])
            if len(got) < 3 and q["query"] not in got:
                got.append(q["query"])
    return out


def _variants() -> dict[str, Any]:
    """Other shapes of a carded answer, for `--breakdown`: what each would cost (interface.md
    fixes `server`, `tool` and a per-match `provenance`; these are measurements, not options)."""
    def once(a: dict[str, Any]) -> None:  # the provenance stated once per answer (all equal here)
        provs = [m.pop("provenance") for m in a["matches"] if "provenance" in m]
        if provs:
            a["provenance"] = provs[0]

    def day(a: dict[str, Any]) -> None:
        for m in a["matches"]:
            m["provenance"]["created_at"] = m["provenance"]["created_at"][:10]

    def one(a: dict[str, Any]) -> None:
        for m in a["matches"]:
            m["examples"] = m["examples"][:1]

    def none(a: dict[str, Any]) -> None:
        for m in a["matches"]:
            m["examples"] = []

    def bare(a: dict[str, Any]) -> None:
        for m in a["matches"]:
            del m["server"], m["tool"]

    return {"created_at_date_only": [day], "one_example": [one], "no_examples": [none],
            "no_server_tool": [bare], "provenance_once": [once], "provenance_once_one_example": [once, one],
            "provenance_once_no_server_tool": [once, bare], "provenance_once_one_example_no_server_tool": [once, one, bare]}


def _breakdown(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a carded answer's tokens go: per match field (key and value counted together, so
    the parts sum to a little more than the whole), and what other shapes would cost."""
    import copy

    import msgspec

    from toolatlas.tokens import count_tokens

    def enc(v: Any) -> str:
        return msgspec.json.encode(v).decode()

    fields: dict[str, int] = {"query": 0}
    for a in answers:
        fields["query"] += count_tokens(f'"query":{enc(a["query"])},')
        for m in a["matches"]:
            for k, v in m.items():
                fields[k] = fields.get(k, 0) + count_tokens(f'"{k}":{enc(v)},')
    n = len(answers)
    variants = {}
    for label, steps in _variants().items():
        total = 0
        for a in answers:
            b = copy.deepcopy(a)
            for step in steps:
                step(b)
            total += count_tokens(enc(b))
        variants[label] = round(total / n, 1)
    return {"fields": {k: round(v / n, 1) for k, v in sorted(fields.items(), key=lambda kv: -kv[1])},
            "json_examples_if": variants}


def dev_set(name: str, seed: int = 1, breakdown: bool = False) -> dict[str, Any]:
    """Mean tokens of top-5 answers on one dev set, json and compact, without and with examples
    (`breakdown`: and where the carded answer's tokens go, see `_breakdown`)."""
    import msgspec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from toolatlas.catalog import signing
    from toolatlas.catalog.attest import AttestResult
    from toolatlas.catalog.cards import Card, Provenance, ServerIdentity, ToolCard
    from toolatlas.catalog.generators import bootstrap_summary
    from toolatlas.catalog.model import ToolRecord
    from toolatlas.gateway.matches import MatchBuilder
    from toolatlas.meta_tools import render_compact
    from toolatlas.tokens import count_tokens

    folder = BENCHDATA / name
    records = read_catalog(folder / "catalog.jsonl")
    queries = read_queries(folder / "queries.jsonl")
    train = folder / "queries-train.jsonl"
    examples = _examples(read_queries(train) if train.exists() else queries)
    by_key = {(r.server, r.name): r for r in records}
    rnd = random.Random(seed)
    picked = rnd.sample(queries, min(SAMPLE_QUERIES * 2, len(queries)))
    builder = MatchBuilder()
    # 16 hex digits of a real key cost ~10 tokens, "0123456789abcdef" 4: count what a card holds.
    key_id = signing.key_id(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
    forms: dict[str, list[int]] = {"json": [], "json_examples": [], "compact": [], "compact_examples": []}
    chars: list[int] = []
    carded_answers: list[dict[str, Any]] = []
    for q in picked:
        recs = top5(q, by_key, records, rnd)
        plain, carded = [], []
        for rank, line in enumerate(recs):
            rec = ToolRecord.make(slug(line.server), line.name, line.description, line.input_schema)
            score = round(1.0 / (rank + 1), 4)
            plain.append(builder.match(rec, None, score))
            own = [e for e in examples.get((line.server, line.name), []) if e != q["query"]][:2]
            card = Card(server=ServerIdentity(name=rec.server, transport="catalog", endpoint=""), summary="", tags=[],
                        tools=[ToolCard(tool=rec.tool, summary=bootstrap_summary(rec), examples=own,
                                        schema_sha256=rec.content_hash)],
                        provenance=Provenance(generator="bootstrap", generator_version="1", created_at="2026-12-02T09:41:27Z",
                                              attested=True, key_id=key_id), signature="x")
            verdict = AttestResult(texts={rec.tool: (card.tools[0].summary, "", ())}, quarantined={},
                                   card_status="verified", card=card)
            carded.append(builder.match(rec, verdict, score))
        for key, matches in (("json", plain), ("json_examples", carded)):
            answer = {"query": q["query"], "matches": matches, "degraded": None}
            text = msgspec.json.encode(answer).decode()
            forms[key].append(count_tokens(text))
            forms["compact" + key[4:]].append(count_tokens(render_compact(answer)))
            if key == "json":
                chars.append(len(text))
            else:
                carded_answers.append(answer)
    means = {k: round(sum(v) / len(v), 1) for k, v in forms.items()}
    out = {"queries": len(picked), "examples_from": "train split" if train.exists() else "other test queries",
           "mean_top5_tokens": means, "mean_top5_json_chars": round(sum(chars) / len(chars), 1),
           "compact_over_json": round(means["compact"] / means["json"], 3),
           "compact_examples_over_json_examples": round(means["compact_examples"] / means["json_examples"], 3)}
    if breakdown:
        out["json_examples_breakdown"] = _breakdown(carded_answers)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", action="append", help="catalog.jsonl (repeatable); default: benchdata")
    ap.add_argument("--queries", help="queries.jsonl for top-5 samples; default: ToolLens test queries")
    ap.add_argument("--tools", type=int, action="append", help="catalog size(s) to build (default 2000)")
    ap.add_argument("--config", help="list the tools of this config's upstreams instead of a catalog")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per upstream in --config mode")
    ap.add_argument("--templates", help="template folder ([surface] templates); default: the shipped ones")
    ap.add_argument("--environment", default="production", help="the environment label rendered into them")
    ap.add_argument("--breakdown", action="store_true",
                    help="per dev set, where a carded top-5 answer's tokens go and what other shapes would cost")
    args = ap.parse_args(argv)
    meta, meta_source = load_meta_tools(args.templates, args.environment)
    out = config_mode(args, meta) if args.config else catalog_mode(args, meta)
    all_records = [r for p in DEFAULT_CATALOGS for r in read_catalog(p)]
    out = {"bench": "tokens", "tokenizer": TOKENIZER_NAME, "meta_tools_source": meta_source,
           "meta_tools": meta_budget(all_records, args.templates, args.environment),
           "dev_sets": {name: dev_set(name, breakdown=args.breakdown) for name in ("toollens", "mcptoolbenchpp")},
           "targets": {"meta_tools_tokens": 400, "toollens_json_examples_mean": 600, "compact_over_json": 0.5},
           **out}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
