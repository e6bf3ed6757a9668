"""Rift inside the daemon: confusable tools found in the live catalog, noted in tool_search
results, and summarised by risk in catalog_status."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support.daemon import Daemon, stdio_testserver


def test_confusable_tools_get_disambiguation_notes(tmp_path: Path) -> None:
    with Daemon(tmp_path, stdio_testserver("crm"), search_extra='embedder = "onnx"\n') as d:
        for name in ("delete_contact", "remove_contact"):
            d.tool("crm__add_tool", {"name": name, "description": "Delete a contact from the address book."})
        d.wait_for(lambda: d.status()["rift"].get("available") and d.status()["rift"]["clusters"]["high"] >= 1,
                   60, "rift finds the planted pair")
        found = d.meta("tool_search", {"query": "delete a contact from the address book", "top_k": 5})["matches"]
        by_name = {m["name"]: m for m in found}
        assert {"crm__delete_contact", "crm__remove_contact"} <= set(by_name)
        # One note per answer (issue 18), on the better ranked of the pair, naming the other.
        noted = [m for m in found if "note" in m]
        assert len(noted) == 1, found
        pair = {"crm__delete_contact", "crm__remove_contact"}
        assert noted[0]["name"] in pair and (pair - {noted[0]["name"]}).pop() in noted[0]["note"], noted[0]
        # A tool outside any cluster carries no note.
        lone = d.meta("tool_search", {"query": "return this server's process id", "top_k": 1})["matches"][0]
        assert "note" not in lone


def test_rift_runs_after_a_restart_with_an_unchanged_catalog(tmp_path: Path) -> None:
    upstream = stdio_testserver("crm")
    with Daemon(tmp_path, upstream, search_extra='embedder = "onnx"\n') as d:
        d.wait_for(lambda: d.status()["rift"].get("available"), 60, "rift after the first index")
    with Daemon(tmp_path, upstream, search_extra='embedder = "onnx"\n') as d:
        assert d.status()["index"]["embeddings_computed"] == 0
        d.wait_for(lambda: d.status()["rift"].get("available"), 60, "rift after a restart")
        # the report names the index it describes: the current one once Rift has caught up
        d.wait_for(lambda: (st := d.status())["rift"]["index_version"] == st["index"]["version"], 60,
                   "rift on the current index")
        d.tool("crm__add_tool", {"name": "erase_contact", "description": "Erase a contact."})
        d.wait_for(lambda: (st := d.status())["rift"]["index_version"] == st["index"]["version"]
                   and st["rift"]["tools"] == st["index"]["tools"], 60, "rift on the changed catalog")



def test_a_note_never_names_a_tool_that_left_the_catalog(tmp_path: Path) -> None:
    """The Rift report describes the index it last analysed (re-run after a quiet second):
    a tool removed since is still in its cluster, but a note names only tools callable now."""
    trio = ("delete_contact", "remove_contact", "erase_contact")
    query = {"query": "delete a contact from the address book", "top_k": 2}
    with Daemon(tmp_path, stdio_testserver("crm"), search_extra='embedder = "onnx"\n') as d:
        for name in trio:
            d.tool("crm__add_tool", {"name": name, "description": "Delete a contact from the address book."})

        def answer() -> tuple[list[str], str]:
            matches = d.meta("tool_search", query)["matches"]
            return [m["name"] for m in matches], next((m["note"] for m in matches if "note" in m), "")

        def outside() -> str | None:
            """A tool of the trio the note names though it is not in the answer."""
            names, note = answer()
            return next((f"crm__{n}" for n in trio if f"crm__{n}" in note and f"crm__{n}" not in names), None)

        named = d.wait_for(outside, 60, "a note naming the third of the trio")
        d.tool("crm__remove_tool", {"name": named.split("__", 1)[1]})
        d.wait_for(lambda: named not in d.search(query["query"], 10), 30, f"{named} gone from search")
        # insert-before-delete: the interim view keeps it callable until the index swap is published
        d.wait_for(lambda: "unknown tool" in d.tool("execute_tool", {"name": named, "arguments": {}})["content"][0]["text"],
                   30, f"{named} no longer callable")
        names, note = answer()
        assert note and named not in note, (names, note)


def test_rift_reanalyses_an_upstream_that_never_stops_changing(tmp_path: Path) -> None:
    """An upstream flipping a tool more often than Rift's quiet second (RIFT_DEBOUNCE_S) does
    not hold Rift off for as long as it goes on: it re-analyses within RIFT_MAX_DELAY_S."""
    with Daemon(tmp_path, stdio_testserver("crm"), search_extra='embedder = "onnx"\n') as d:
        d.wait_for(lambda: (st := d.status())["rift"].get("available")
                   and st["rift"]["index_version"] == st["index"]["version"], 60, "rift on the first index")
        first = d.status()["rift"]["index_version"]
        stop = threading.Event()

        def churn() -> None:
            with d.client() as c:
                for i in range(2000):  # bounded; stopped long before
                    if stop.wait(0.2):
                        return
                    c.call_tool("crm__add_tool", {"name": f"flip_{i}", "description": f"Flip tool number {i}."})
                    if i:
                        c.call_tool("crm__remove_tool", {"name": f"flip_{i - 1}"})

        flipper = threading.Thread(target=churn, daemon=True)
        flipper.start()
        try:
            d.wait_for(lambda: d.status()["rift"]["index_version"] > first, 60, "rift re-analysing during the churn")
            assert flipper.is_alive()  # while the upstream was still changing
        finally:
            stop.set()
            flipper.join(30)
