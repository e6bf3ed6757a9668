"""Token accounting: what a catalog costs a client's context, counted with a real tokenizer.

The counts come from `anthropic-tokenizer`, a local (offline) BPE tokenizer for Claude
models; it is unofficial, so the figures are close estimates of what Anthropic's API counts,
not billing numbers. No network: the package's API-backed counter is never used.

What is counted is the JSON an MCP client receives for `tools/list` (`{"tools": [...]}`,
compact separators, as the SDK serialises it): every federated tool for the full catalog,
the three meta-tools for the gateway surface. A tool_search result is counted as its JSON
object once (the text content block; clients that also read `structuredContent` see it twice).

Counting ~1 MB of JSON takes about a second on one core, and the tokenizer's vocabulary is
about 33 MB resident once loaded: the daemon counts in a short-lived child process
(`python -m toolatlas.tokens`, see `main`) and caches the result per index version. In
process (the CLI, bench/), the tokenizer holds the GIL for a whole call, so long texts are
counted in pieces of about
`PIECE_CHARS` cut after a comma (`count_tokens_in_pieces`): no call then stalls the process's
other threads for more than a few milliseconds (one call on the JSON of 20,000 tools held
them for seconds). A cut can merge or split a token at the seam, so the sum differs from a
single call by about one token per piece (measured in tests/integration/test_tokens.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar

try:
    _VERSION = metadata.version("anthropic-tokenizer")
except metadata.PackageNotFoundError:  # pragma: no cover - it is a declared dependency
    _VERSION = "unknown"

TOKENIZER_NAME: str = f"anthropic-tokenizer {_VERSION} (local Claude BPE, unofficial)"

_counter: Callable[[str], int] | None = None
T = TypeVar("T")


def count_tokens(text: str) -> int:
    """Number of tokens in `text` under the local Claude tokenizer."""
    global _counter
    if _counter is None:
        # Imported on first use: keeps `import toolatlas.tokens` cheap for the CLI.
        from anthropic_tokenizer import count_tokens as local_count

        _counter = local_count
    return int(_counter(text))


PIECE_CHARS = 8192
EXACT_MAX = 5000  # larger catalogs: estimated from a sample of this many tools


def count_tokens_in_pieces(text: str, piece: int = PIECE_CHARS) -> int:
    """`count_tokens(text)` as a sum over pieces of about `piece` characters, each cut after
    the last comma within it (or at `piece` if it has none), releasing the GIL in between."""
    total = 0
    start = 0
    n = len(text)
    while start < n:
        end = min(n, start + piece)
        if end < n:
            comma = text.rfind(",", start, end)
            if comma > start:
                end = comma + 1
        total += count_tokens(text[start:end])
        start = end
        time.sleep(0)  # let the event loop and searches run between pieces
    return total


def tools_list_json(tools: list[dict[str, Any]]) -> str:
    """The `tools/list` result body as a client receives it (encoded a tool at a time: one
    json.dumps call over a 100,000-tool list would hold the GIL for about a second)."""
    return '{"tools":[' + ",".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in tools) + "]}"


def evenly_sampled(tools: list[T], exact_max: int | None = EXACT_MAX) -> list[T]:
    """The tools a report counts: all of them up to `exact_max`, else `exact_max` evenly
    spaced ones (see `catalog_token_report`)."""
    n = len(tools)
    if exact_max is None or n <= exact_max:
        return tools
    step = n / exact_max
    return [tools[int(i * step)] for i in range(exact_max)]


def catalog_token_report(
    full_tools_list: list[dict[str, Any]],
    meta_tools_list: list[dict[str, Any]],
    sample_search_results: list[dict[str, Any]] | None = None,
    *,
    exact_max: int | None = EXACT_MAX,
    compact_results: list[str] | None = None,
    catalog_size: int | None = None,
) -> dict[str, Any]:
    """Token cost of the full catalog vs the meta-tool surface.

    `full_tools_list` and `meta_tools_list` are MCP tool dicts (`name`, `description`,
    `inputSchema`, ...). `sample_search_results` are tool_search result objects
    (`{"query", "matches", "degraded"}`, normally top 5); `compact_results` the same answers
    as `format: "compact"` text (their mean is `mean_top5_compact_tokens`). Returns
    `{"tokenizer", "full_catalog_tokens", "meta_tools_tokens", "reduction", "tools",
    "mean_top5_search_result_tokens"}`; `reduction` is 1 - meta/full (0.0 for an empty
    catalog) and the mean is None without samples.

    Catalogs above `exact_max` tools are estimated from an evenly spaced sample of
    `exact_max` tools (tokens per tool in the sample x tools, plus the list's wrapper) and
    the report says `"estimated_from_sample": N`: counting 100,000 tools exactly costs ~20 s
    of CPU. `catalog_size` says that `full_tools_list` is already such a sample (from
    `evenly_sampled`) of a catalog of that many tools.
    """
    n = len(full_tools_list) if catalog_size is None else catalog_size
    sample = evenly_sampled(full_tools_list, exact_max)
    if len(sample) < n:
        wrapper = count_tokens(tools_list_json([]))
        per_tool = (count_tokens_in_pieces(tools_list_json(sample)) - wrapper) / len(sample)
        full = int(round(wrapper + per_tool * n))
    else:
        full = count_tokens_in_pieces(tools_list_json(sample))
    meta = count_tokens(tools_list_json(meta_tools_list))
    mean: float | None = None
    if sample_search_results:
        counts = [
            count_tokens_in_pieces(json.dumps(r, ensure_ascii=False, separators=(",", ":")))
            for r in sample_search_results
        ]
        mean = sum(counts) / len(counts)
    compact: dict[str, float] = {}
    if compact_results:
        compact["mean_top5_compact_tokens"] = sum(count_tokens(t) for t in compact_results) / len(compact_results)
    return {
        "tokenizer": TOKENIZER_NAME,
        "full_catalog_tokens": full,
        "meta_tools_tokens": meta,
        "reduction": (1.0 - meta / full) if full > 0 else 0.0,
        "tools": n,
        "mean_top5_search_result_tokens": mean,
        **compact,
        **({"estimated_from_sample": len(sample)} if len(sample) < n else {}),
    }


def main() -> None:
    """`python -m toolatlas.tokens`: the daemon's counting child. Reads one JSON object from
    stdin (`tools`, `catalog_size`, `meta`, `samples`, `compact`: the arguments of
    `catalog_token_report`) and writes the report as one JSON object to stdout.

    The daemon counts here rather than in process: the tokenizer's vocabulary is about 33 MB
    of resident memory that a long-running daemon would keep for a job it does once per
    catalog change, and counting holds the GIL for about a second per 2,000 tools."""
    import sys

    req = json.load(sys.stdin)
    report = catalog_token_report(req["tools"], req["meta"], req.get("samples"),
                                  compact_results=req.get("compact"), catalog_size=req.get("catalog_size"))
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
