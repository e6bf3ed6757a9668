"""Close-match suggestions for unknown tool names from a trigram index (issue #15 item 8):
the right names from a 20,000-tool catalog, and a bounded candidate pool per lookup."""

from __future__ import annotations

import pytest
from toolatlas.gateway.suggest import POOL, NameIndex, suggest

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

FAMILIES = ("fetch", "store", "parse", "render", "sync", "audit", "index", "notify")
NAMES = [f"bulk__many_{i:05d}_{FAMILIES[i % len(FAMILIES)]}_record" for i in range(20_000)]
SMALL = ["notes__create_note", "notes__search_notes", "weather__forecast"]


def _tool(name: str) -> str:
    return name.split("__", 1)[1]


def test_a_misspelt_name_gets_the_tool_meant_first_from_20000_names() -> None:
    index = NameIndex(NAMES)
    wanted = NAMES[12_345]
    typo = wanted.replace("_record", "_recrod")
    assert suggest(typo, {"bulk": index}, _tool)[0] == wanted
    transposed = wanted.replace("many", "mnay")
    assert suggest(transposed, {"bulk": index}, _tool)[0] == wanted


def test_the_right_tool_under_a_wrong_server_is_suggested_on_its_server() -> None:
    indexes = {"notes": NameIndex(SMALL[:2]), "weather": NameIndex(SMALL[2:])}
    assert suggest("an_unrelated_server_name__forecast", indexes, _tool) == ["weather__forecast"]
    assert suggest("notes__create_noet", indexes, _tool)[0] == "notes__create_note"


def test_nothing_alike_gets_no_suggestion_and_every_lookup_ranks_a_bounded_pool() -> None:
    index = NameIndex(NAMES)
    assert suggest("zzzz", {"bulk": index}, _tool) == []
    assert len(index.candidates("bulk__many_")) == POOL  # every name shares these trigrams


def test_a_servers_other_tools_are_not_suggested_for_its_prefix_alone() -> None:
    """`beta__nope` was answered "Did you mean: beta__pid, beta__hang, beta__echo?" (the shared
    `beta__` made any short name close enough), and `beta__echoo` got beta__crash beside
    beta__echo: a model may well call one of them."""
    names = [f"beta__{t}" for t in ("echo", "crash", "hang", "pid", "sleep", "add_tool", "remove_tool")]
    indexes = {"beta": NameIndex(names), "alpha": NameIndex(["alpha__echo", "alpha__crash"])}
    assert suggest("beta__nope", indexes, _tool) == []
    assert suggest("beta__echoo", indexes, _tool) == ["beta__echo", "alpha__echo"]  # an echo elsewhere, no crash
    assert suggest("beta.echo", indexes, _tool) == ["beta__echo", "alpha__echo"]
    assert sorted(suggest("gamma__echo", indexes, _tool)) == ["alpha__echo", "beta__echo"]
    assert suggest("beta__remove_tol", indexes, _tool)[0] == "beta__remove_tool"


def test_a_name_written_in_other_case_gets_the_tool_meant() -> None:
    """`GitHub__Create_Issue` for `github__create_issue` got no suggestion: the comparison
    counted case, and every letter of the brand-cased server differed."""
    indexes = {"github": NameIndex(["github__create_issue", "github__list_issues"]),
               "notes": NameIndex(["notes__create_note"])}
    assert suggest("GitHub__Create_Issue", indexes, _tool)[:1] == ["github__create_issue"]
    assert suggest("NOTES__CREATE_NOTE", indexes, _tool)[:1] == ["notes__create_note"]
    assert suggest("Wrong__Create_Issue", indexes, _tool)[:1] == ["github__create_issue"]
