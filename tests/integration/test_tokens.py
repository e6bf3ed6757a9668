"""Token accounting with the real local tokenizer: the meta-tool surface vs a 2,000-tool catalog."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import anthropic_tokenizer
import anyio
import pytest

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


def test_the_counting_child_reports_what_counting_in_process_does() -> None:
    from toolatlas.gateway.tokens import count_in_child

    tools = synthetic_tools(40)
    top5 = [{"query": "get an issue", "matches": tools[:5], "degraded": None}]
    compact = ["srv0__get_issue_0: Get an issue"]
    # counted exactly; and as the even sample of a 60,000-tool catalog that the daemon sends
    for size in (40, 60_000):
        payload = json.dumps({"tools": tools, "catalog_size": size, "meta": META_TOOLS,
                              "samples": top5, "compact": compact}).encode()
        child = anyio.run(count_in_child, payload)
        local = catalog_token_report(tools, META_TOOLS, top5, compact_results=compact, catalog_size=size)
        assert child == local
        assert child["tools"] == size and child.get("estimated_from_sample") == (40 if size > 40 else None)


def test_a_failed_counter_is_an_error_with_its_last_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolatlas.gateway import tokens as gw_tokens

    failing = "import sys; sys.stdin.read(); sys.exit('bad input')"
    monkeypatch.setattr(gw_tokens, "COUNTER_ARGV", [sys.executable, "-c", failing])
    with pytest.raises(RuntimeError, match="exited with 1: bad input"):
        anyio.run(gw_tokens.count_in_child, b"{}")


def test_a_cancelled_count_kills_its_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolatlas.gateway import tokens as gw_tokens

    pidfile = tmp_path / "pid"
    sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    monkeypatch.setattr(gw_tokens, "COUNTER_ARGV", [sys.executable, "-c", sleeper, str(pidfile)])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(gw_tokens.count_in_child, b"{}")
            with anyio.fail_after(60):
                while not pidfile.exists() or not pidfile.read_text():
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()

    anyio.run(main)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, f"counter {pid} still runs after its count was cancelled"
        time.sleep(0.05)


def test_counts_wait_for_the_limiter_one_child_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolatlas.gateway import tokens as gw_tokens

    # A child marks itself alive, and for up to argv[2] seconds looks for another live one
    # (or for an overlap another child has seen).
    child = (
        "import glob, json, os, sys, time\n"
        "d, wait = sys.argv[1], float(sys.argv[2])\n"
        "mine = os.path.join(d, 'alive-%d' % os.getpid())\n"
        "open(mine, 'w').close()\n"
        "deadline = time.monotonic() + wait\n"
        "while time.monotonic() < deadline:\n"
        "    if len(glob.glob(os.path.join(d, 'alive-*'))) >= 2:\n"
        "        open(os.path.join(d, 'overlap-%d' % os.getpid()), 'w').close()\n"
        "        break\n"
        "    if glob.glob(os.path.join(d, 'overlap-*')):\n"
        "        break  # seen by the others already\n"
        "    time.sleep(0.02)\n"
        "os.unlink(mine)\n"
        "sys.stdin.read()\n"
        "print(json.dumps({'pid': os.getpid()}))\n"
    )

    def run_three(limited: bool) -> list[dict[str, int]]:
        # one at a time: each looks for half a second and finds nobody; all at once: the
        # first to start waits (up to 60 s) until the next one is alive beside it
        monkeypatch.setattr(gw_tokens, "COUNTER_ARGV", [sys.executable, "-c", child, str(tmp_path),
                                                        "0.5" if limited else "60"])

        async def main() -> list[dict[str, int]]:
            limiter = anyio.CapacityLimiter(1) if limited else None
            got: list[dict[str, int]] = []

            async def one() -> None:
                got.append(await gw_tokens.count_in_child(b"{}", limiter=limiter))

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(one)
            return got

        return anyio.run(main)

    assert len({r["pid"] for r in run_three(limited=True)}) == 3
    assert not list(tmp_path.glob("overlap-*"))
    run_three(limited=False)  # the detector works: unlimited children do run side by side
    assert list(tmp_path.glob("overlap-*"))
    assert not list(tmp_path.glob("alive-*"))
