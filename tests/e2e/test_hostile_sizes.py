"""A real daemon with a stdio upstream of outsized things (tests/support/servers/hostile.py,
issue #15 item 8): a 5 MB description, a 200 KB inputSchema, 3,000 more tools and a tool
returning 400,000 content blocks. Correctness only (the stalls are measured by
bench/stalls.py): the outsized texts are cut to the configured bounds and each cut is
listed in catalog_status; a misspelt name gets the tool meant; the huge result fails that
one call with an error naming max_result_blocks, and the next call on the session works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.daemon import Daemon, hostile_upstream
from tests.support.servers.hostile import FAMILIES
from toolatlas.catalog.sanitize import DESCRIPTION_CHARS

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

MANY = 3000
DESCRIPTION_BOUND = 2000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp: Path = tmp_path_factory.mktemp("sizes")
    up = hostile_upstream("--tools", str(MANY), "--description-bytes", "5000000", "--schema-bytes", "200000",
                          extra=f"max_description_chars = {DESCRIPTION_BOUND}\n")
    with Daemon(tmp, up) as d:
        d.wait_for(lambda: d.status()["tools"] >= MANY + 4, 60, "the catalog listed")
        yield d


def _server(d: Daemon) -> dict[str, object]:
    return next(s for s in d.status()["servers"] if s["name"] == "hostile")


@pytest.mark.timeout(120)
def test_outsized_description_and_schema_are_cut_to_the_bounds_and_reported(daemon: Daemon) -> None:
    problems = _server(daemon).get("problems")
    assert isinstance(problems, dict), _server(daemon)
    assert problems["huge_doc"] == (f"description cut from 5000000 to {DESCRIPTION_BOUND} characters "
                                    "(max_description_chars)")
    assert "over max_schema_bytes (65536)" in problems["huge_schema"]
    assert set(problems) == {"huge_doc", "huge_schema"}
    matches = daemon.meta("tool_search", {"query": "a tool whose description never ends", "top_k": 3})["matches"]
    doc = next(m for m in matches if m["name"] == "hostile__huge_doc")
    # a match shows at most the sanitizer's cap of what ingest kept (issue 18)
    assert len(doc["description"]) <= DESCRIPTION_CHARS < DESCRIPTION_BOUND and doc["description"].endswith("...")
    matches = daemon.meta("tool_search", {"query": "a tool with an outsized input schema", "top_k": 3})["matches"]
    schema = next(m for m in matches if m["name"] == "hostile__huge_schema")
    assert schema["inputSchema"] == {"type": "object"}


@pytest.mark.timeout(120)
def test_a_misspelt_name_gets_the_tool_meant_from_a_large_catalog(daemon: Daemon) -> None:
    meant = f"hostile__many_01234_{FAMILIES[1234 % len(FAMILIES)]}_record"
    r = daemon.tool("execute_tool", {"name": meant.replace("_record", "_recrod"), "arguments": {}})
    assert r.get("isError"), r
    text = r["content"][0]["text"]
    assert text.startswith(f"unknown tool '{meant.replace('_record', '_recrod')}'. Did you mean: {meant}"), text


@pytest.mark.timeout(120)
def test_a_result_of_400000_blocks_fails_that_call_and_the_session_goes_on(daemon: Daemon) -> None:
    r = daemon.tool("execute_tool", {"name": "hostile__blocks", "arguments": {"n": 400_000}})
    assert r.get("isError"), {k: r[k] for k in r if k != "content"} | {"blocks": len(r.get("content") or [])}
    text = r["content"][0]["text"]
    assert "has 400000 content blocks, more than max_result_blocks (1000)" in text and "'hostile'" in text, text
    at_bound = daemon.tool("execute_tool", {"name": "hostile__blocks", "arguments": {"n": 1000}})
    assert not at_bound.get("isError") and len(at_bound["content"]) == 1000
    assert _server(daemon)["reconnects"] == 0


@pytest.mark.timeout(120)
def test_a_megabyte_tool_name_gets_a_short_error_and_no_suggestion_search(daemon: Daemon) -> None:
    """No gateway name is over 64 characters: a caller's 1 MB name gets an error of a few
    hundred characters that says so (it was echoed whole, a 1 MB reply, after a "did you
    mean" search over its million trigrams: 4.6 s of CPU holding the GIL, per call)."""
    for name in ("x" * 1_000_000, "hostile__" + "y" * 1_000_000):
        r = daemon.tool("execute_tool", {"name": name, "arguments": {}})
        assert r.get("isError"), {k: r[k] for k in r if k != "content"}
        text = r["content"][0]["text"]
        assert len(text) < 400 and f"({len(name)} characters; a tool name has at most 64)" in text, text[:500]
        assert "Did you mean" not in text and text.endswith("Use tool_search to find tools."), text[:500]
