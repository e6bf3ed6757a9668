"""Token accounting with the real local tokenizer: the meta-tool surface vs a 2,000-tool catalog."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import anthropic_tokenizer

from toolatlas.meta_tools import META_TOOLS
from toolatlas.tokens import TOKENIZER_NAME, catalog_token_report, count_tokens, count_tokens_in_pieces, tools_list_json

_VERBS = ["get", "list", "create", "update", "delete", "search", "send", "read", "fetch", "sync"]
_NOUNS = ["issue", "file", "message", "invoice", "user", "event", "record", "page", "ticket", "order"]
_PARAMS = [("id", "string", "Identifier of the item."), ("limit", "integer", "Maximum results."),
           ("query", "string", "Free-text filter."), ("path", "string", "Absolute path."),
           ("cursor", "string", "Pagination cursor from a previous call.")]


def synthetic_tools(n: int, seed: int = 7) -> list[dict]:
    """`n` small, plausible MCP tools (short descriptions, 1-3 parameters): a conservative catalog."""
    rnd = random.Random(seed)
    tools = []
    for i in range(n):
        verb, noun = rnd.choice(_VERBS), rnd.choice(_NOUNS)
        params = rnd.sample(_PARAMS, rnd.randint(1, 3))
        tools.append({
            "name": f"srv{i % 40}__{verb}_{noun}_{i}",
            "description": f"{verb.capitalize()} a {noun} in service {i % 40}. Returns JSON.",
            "inputSchema": {
                "type": "object",
                "properties": {p: {"type": t, "description": d} for p, t, d in params},
                "required": [params[0][0]],
            },
        })
    return tools


def test_tokenizer_is_real_and_named() -> None:
    assert "anthropic-tokenizer" in TOKENIZER_NAME
    assert count_tokens("") == 0
    text = "Read the complete contents of a file from the file system."
    assert count_tokens(text) == anthropic_tokenizer.count_tokens(text)
    assert 5 < count_tokens(text) < len(text)  # BPE: fewer tokens than characters
    assert count_tokens(text * 10) > 9 * count_tokens(text)


def test_meta_tool_surface_is_99_percent_smaller_at_2000_tools() -> None:
    tools = synthetic_tools(2000)
    top5 = [
        {"query": f"q{j}", "matches": [dict(t, server=t["name"].split("__")[0], score=0.5)
                                        for t in tools[j * 5:(j + 1) * 5]], "degraded": None}
        for j in range(4)
    ]
    report = catalog_token_report(tools, META_TOOLS, top5)

    full = anthropic_tokenizer.count_tokens(json.dumps({"tools": tools}, separators=(",", ":")))
    meta = anthropic_tokenizer.count_tokens(json.dumps({"tools": META_TOOLS}, separators=(",", ":")))
    # counted in comma-cut pieces (see count_tokens_in_pieces): within 0.1% of one call
    assert abs(report["full_catalog_tokens"] - full) / full < 0.001, (report["full_catalog_tokens"], full)
    assert report["meta_tools_tokens"] == meta
    assert report["tools"] == 2000
    assert report["tokenizer"] == TOKENIZER_NAME
    assert report["reduction"] == 1 - meta / report["full_catalog_tokens"]
    assert meta / full <= 0.01, report  # the acceptance figure: >= 99% smaller
    assert report["reduction"] >= 0.99
    # A top-5 answer costs a few hundred tokens, a fraction of the catalog.
    assert 5 * 20 < report["mean_top5_search_result_tokens"] < full / 100


def test_report_edges() -> None:
    empty = catalog_token_report([], META_TOOLS)
    assert empty["full_catalog_tokens"] == count_tokens('{"tools":[]}')
    assert empty["reduction"] < 0  # three meta-tools cost more than nothing
    assert empty["mean_top5_search_result_tokens"] is None
    # With three tools the meta surface is no saving at all: reported honestly, negative.
    small = catalog_token_report(synthetic_tools(3), META_TOOLS)
    assert small["reduction"] < 0
    assert tools_list_json([{"name": "é"}]) == '{"tools":[{"name":"é"}]}'


def test_import_is_light() -> None:
    code = "import sys, toolatlas.tokens; print('anthropic_tokenizer' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_counting_in_pieces_matches_one_call_closely() -> None:
    """The daemon counts long texts in comma-cut pieces (so no tokenizer call holds the GIL
    for long); the sum stays within 0.1% of one call over the whole text."""
    text = tools_list_json(synthetic_tools(2000))
    whole = count_tokens(text)
    pieces = count_tokens_in_pieces(text, piece=4096)
    assert len(text) // 4096 > 100  # really many seams
    assert abs(pieces - whole) / whole < 0.001, (pieces, whole)
    short = '{"tools":[]}'
    assert count_tokens_in_pieces(short) == count_tokens(short)
    assert count_tokens_in_pieces("") == 0


def test_large_catalogs_are_estimated_from_an_even_sample() -> None:
    tools = synthetic_tools(3000)
    exact = catalog_token_report(tools, META_TOOLS)
    est = catalog_token_report(tools, META_TOOLS, exact_max=500)
    assert "estimated_from_sample" not in exact
    assert est["estimated_from_sample"] == 500 and est["tools"] == 3000
    assert abs(est["full_catalog_tokens"] - exact["full_catalog_tokens"]) / exact["full_catalog_tokens"] < 0.02, (est, exact)
    assert est["meta_tools_tokens"] == exact["meta_tools_tokens"]
