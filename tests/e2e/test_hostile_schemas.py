"""A real daemon with a hostile stdio upstream (tests/support/servers/hostile.py) whose tools
carry a remote `$ref`, a `file://` `$ref`, a `$ref` cycle and a catastrophic `pattern`
(issue #15 items 2 and 3), results against their own outputSchema (one with a catastrophic
`pattern`: the SDK's check of it froze the daemon's event loop), or schemas the meta-schema
rejects (item 7). Correctness only: every hostile call gets an error or a result,
the HTTP listener the remote refs point at is never contacted, and another client's
tool_search on the same daemon keeps answering while the hostile calls run."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.daemon import Daemon, hostile_upstream
from tests.support.listener import RecordingListener

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

ARG = "a" * 34 + "!"  # `re` backtracks for minutes on ^(a+)+$ with this


HOSTILE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("hostile__evil_pattern", {"s": ARG}),
    ("hostile__evil_keys", {ARG: "v"}),
    ("hostile__remote_ref", {"x": "a string", "n": 1}),
    ("hostile__remote_root", {"x": 1}),
    ("hostile__file_ref", {"x": "not an integer"}),
    ("hostile__ref_cycle", {"q": 1}),
    ("hostile__evil_output", {}),
    ("hostile__bad_output", {}),
    ("hostile__good_output", {}),
]


@pytest.mark.timeout(150)
def test_hostile_schemas_never_fetch_never_read_and_never_freeze_other_clients(tmp_path: Path) -> None:
    listener = RecordingListener()  # never answers: a fetch would hang the call
    ref_file = tmp_path / "schema.json"
    ref_file.write_text('{"type": "integer"}')  # if it were read, "not an integer" would be rejected
    d = Daemon(tmp_path, hostile_upstream("--ref-url", f"{listener.url}/x", "--ref-file", ref_file.as_uri(), "--outputs"))
    try:
        with d:
            d.wait_for(lambda: "hostile__evil_pattern" in d.search("hostile schema evil pattern", top_k=10),
                       60, "hostile tools indexed")
            answers: list[list[str]] = []
            results: dict[str, dict[str, Any]] = {}
            done = threading.Event()
            failures: list[BaseException] = []

            def hostile() -> None:
                try:
                    with d.client() as c:
                        for name, args in HOSTILE_CALLS:
                            results[name] = c.call_tool(name, args)
                except BaseException as exc:  # reported by the main thread
                    failures.append(exc)
                finally:
                    done.set()

            t = threading.Thread(target=hostile, daemon=True)
            t.start()
            with d.client() as other:
                deadline = time.monotonic() + 120
                while (not done.is_set() or not answers) and time.monotonic() < deadline:
                    r = other.call_tool("tool_search", {"query": "hostile schema", "top_k": 3})
                    assert not r.get("isError"), r
                    answers.append([m["name"] for m in r["structuredContent"]["matches"]])
            t.join(timeout=60)
            assert done.is_set() and not failures, failures
            assert answers and all(a for a in answers)
            assert set(results) == {n for n, _ in HOSTILE_CALLS}
            # The catastrophic patterns: a clear error for that call (the argument does not match).
            for name in ("hostile__evil_pattern", "hostile__evil_keys"):
                assert results[name].get("isError"), results[name]
            # Remote and file refs are never resolved: the rest of the schema is checked, the call goes out.
            for name in ("hostile__remote_ref", "hostile__remote_root", "hostile__file_ref", "hostile__ref_cycle"):
                r = results[name]
                assert not r.get("isError"), r
                assert r["content"][0]["text"] == "called", r
            # Results against their outputSchema: the SDK's decisions and messages, bounded.
            evil, bad = results["hostile__evil_output"], results["hostile__bad_output"]
            assert evil.get("isError") and "evil_output" in evil["content"][0]["text"], evil
            assert bad.get("isError"), bad
            assert "Invalid structured content returned by tool bad_output: 'not an integer' is not of type " \
                   "'integer'" in bad["content"][0]["text"], bad
            good = results["hostile__good_output"]
            assert not good.get("isError") and good["structuredContent"] == {"n": 1}, good
            assert d.search("hostile schema", top_k=3)  # still answering afterwards
    finally:
        listener.close()
    assert listener.hits == []


@pytest.mark.timeout(120)
def test_malformed_schemas_are_repaired_per_tool_and_reported(tmp_path: Path) -> None:
    """#15 item 7: `"enum": 5`, an object enum and `items.enum: true` each cost only the bad
    part of that one tool; the upstream stays in search and calls, and catalog_status and the
    log name each repaired tool and what was removed."""
    with Daemon(tmp_path, hostile_upstream("--malformed")) as d:
        bad = {"enum_number", "enum_object", "items_enum_true"}
        four = bad | {"well_formed"}
        d.wait_for(lambda: four <= {n.removeprefix("hostile__") for n in d.search("hostile schema", top_k=10)},
                   60, "all four tools searchable")
        (server,) = [s for s in d.status()["servers"] if s["name"] == "hostile"]
        assert server["state"] == "ready" and server["searchable"], server
        assert set(server["problems"]) == bad, server
        assert server["problems"]["enum_number"] == "removed properties/x/enum: 5 is not of type 'array'"
        assert server["problems"]["items_enum_true"].startswith("removed properties/x/items/enum")
        for tool in sorted(four):
            r = d.tool(f"hostile__{tool}", {"x": ["a"]} if tool == "items_enum_true" else {"x": "a"})
            assert not r.get("isError") and r["content"][0]["text"] == "called", (tool, r)
        log = d.log.read_text()
        for tool in bad:
            assert f"tool {tool!r} was changed at ingest" in log, log[-3000:]
        assert "'well_formed' was changed" not in log
