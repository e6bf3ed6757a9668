"""Rift notes name only tools the caller may use (#15 item 6)."""

from __future__ import annotations

import pytest
from toolatlas.gateway.search import add_rift_notes
from toolatlas.rift.report import Cluster, RiftReport, ToolDiag

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile


def _report() -> RiftReport:
    members = ("git__create_issue", "vault7__create_issue")
    tools = {m: ToolDiag(name=m, cluster=0, margin=0.01, confused_with=members[1 - i], distinguishing=("git",),
                         diagnosis="SHARPEN", query="create issue") for i, m in enumerate(members)}
    cluster = Cluster(id=0, members=members, cohesion=0.95, risk="high", worst_margin=0.01, shared=("create", "issue"))
    return RiftReport(clusters=(cluster,), tools=tools, n_tools=2, theta=0.65, high=0.9, medium=0.8,
                      margin_analysis=True, embedder="test")


def test_note_names_only_visible_siblings() -> None:
    report = _report()
    assert "vault7__create_issue" in (report.note_for("git__create_issue") or "")
    assert report.note_for("git__create_issue", visible=lambda n: n.startswith("git__")) is None


def test_search_notes_are_scoped_to_the_callers_servers() -> None:
    matches = [{"name": "git__create_issue"}, {"name": "vault7__create_issue"}]
    add_rift_notes(_report(), matches, {"git", "vault7"}, live=_report().tools)
    assert "vault7__create_issue" in matches[0]["note"]
    # a caller without vault7 (its match would not be shown either) never reads its name
    only_git = [{"name": "git__create_issue"}, {"name": "git__create_issue"}]
    add_rift_notes(_report(), only_git, {"git"}, live=_report().tools)
    assert all("vault7" not in m.get("note", "") for m in only_git)


def test_one_note_per_cluster_naming_at_most_three_siblings() -> None:
    """issue 18 item 4: a cluster of five in the answer gets one note, not five."""
    members = tuple(f"s{i}__delete_item" for i in range(5))
    tools = {m: ToolDiag(name=m, cluster=0, margin=0.01, confused_with=members[(i + 1) % 5], distinguishing=(f"s{i}",),
                         diagnosis="SHARPEN", query="delete item") for i, m in enumerate(members)}
    report = RiftReport(clusters=(Cluster(id=0, members=members, cohesion=0.95, risk="high", worst_margin=0.01,
                                          shared=("delete", "item")),),
                        tools=tools, n_tools=5, theta=0.65, high=0.9, medium=0.8, margin_analysis=True, embedder="test")
    matches = [{"name": m} for m in members]
    add_rift_notes(report, matches, {f"s{i}" for i in range(5)}, live=members)
    notes = [m["note"] for m in matches if "note" in m]
    assert len(notes) == 1 and "note" in matches[0], matches
    named = [m for m in members[1:] if m in notes[0]]
    assert len(named) == 3 and "(+1 more)" in notes[0], notes[0]
    assert "s0__delete_item: s0" in notes[0]  # what sets the match itself apart
