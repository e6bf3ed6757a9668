"""Token accounting: what a catalog costs a client's context, counted with a real tokenizer.

The counts come from `anthropic-tokenizer`, a local (offline) BPE tokenizer for Claude
models; it is unofficial, so the figures are close estimates of what Anthropic's API counts,
not billing numbers. No network: the package's API-backed counter is never used.

What is counted is the JSON an MCP client receives for `tools/list` (`{"tools": [...]}`,
compact separators, as the SDK serialises it): every federated tool for the full catalog,
the three meta-tools for the gateway surface. A tool_search result is counted as its JSON
object once (the text content block; clients that also read `structuredContent` see it twice).

Counting ~1 MB of JSON takes about a second on one core: call `catalog_token_report` from a
worker thread (`anyio.to_thread.run_sync`) and cache the result per index version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import metadata
from typing import Any

try:
    _VERSION = metadata.version("anthropic-tokenizer")
except metadata.PackageNotFoundError:  # pragma: no cover - it is a declared dependency
    _VERSION = "unknown"

TOKENIZER_NAME: str = f"anthropic-tokenizer {_VERSION} (local Claude BPE, unofficial)"

_counter: Callable[[str], int] | None = None


def count_tokens(text: str) -> int:
    """Number of tokens in `text` under the local Claude tokenizer."""
    global _counter
    if _counter is None:
        # Imported on first use: keeps `import toolatlas.tokens` cheap for the CLI.
        from anthropic_tokenizer import count_tokens as local_count  # type: ignore[import-untyped]

        _counter = local_count
    return int(_counter(text))


def tools_list_json(tools: list[dict[str, Any]]) -> str:
    """The `tools/list` result body as a client receives it."""
    return json.dumps({"tools": tools}, ensure_ascii=False, separators=(",", ":"))


def catalog_token_report(
    full_tools_list: list[dict[str, Any]],
    meta_tools_list: list[dict[str, Any]],
    sample_search_results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Token cost of the full catalog vs the meta-tool surface.

    `full_tools_list` and `meta_tools_list` are MCP tool dicts (`name`, `description`,
    `inputSchema`, ...). `sample_search_results` are tool_search result objects
    (`{"query", "matches", "degraded"}`, normally top 5). Returns
    `{"tokenizer", "full_catalog_tokens", "meta_tools_tokens", "reduction", "tools",
    "mean_top5_search_result_tokens"}`; `reduction` is 1 - meta/full (0.0 for an empty
    catalog) and the mean is None without samples.
    """
    full = count_tokens(tools_list_json(full_tools_list))
    meta = count_tokens(tools_list_json(meta_tools_list))
    mean: float | None = None
    if sample_search_results:
        counts = [
            count_tokens(json.dumps(r, ensure_ascii=False, separators=(",", ":")))
            for r in sample_search_results
        ]
        mean = sum(counts) / len(counts)
    return {
        "tokenizer": TOKENIZER_NAME,
        "full_catalog_tokens": full,
        "meta_tools_tokens": meta,
        "reduction": (1.0 - meta / full) if full > 0 else 0.0,
        "tools": len(full_tools_list),
        "mean_top5_search_result_tokens": mean,
    }
