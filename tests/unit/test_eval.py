"""`toolatlas eval`: metric definitions, the JSON shape of docs/interface.md, and that every
mode runs on MCPToolBench++ through the same Engine the daemon serves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from toolatlas.evaluation import metrics
from toolatlas.evaluation.cli import main
from toolatlas.evaluation.datasets import benchdata_dir

MCP = benchdata_dir() / "mcptoolbenchpp"
MODES = {"hybrid", "bm25", "dense", "two-stage", "keyword", "learned"}


def test_metric_definitions() -> None:
    ranked = ["a", "x", "b", "y"]
    rel = {"a", "b", "c"}
    assert metrics.recall_at(ranked, rel, 3) == pytest.approx(2 / 3)
    assert metrics.hit_at(ranked, rel, 1) == 1.0 and metrics.hit_at(["x"], rel, 1) == 0.0
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert metrics.ndcg_at(ranked, rel, 3) == pytest.approx((1 + 1 / math.log2(4)) / ideal)
    assert metrics.ndcg_at(["a", "b", "c"], rel, 3) == pytest.approx(1.0)
    assert metrics.reciprocal_rank(ranked, {"b"}) == pytest.approx(1 / 3)
    assert metrics.reciprocal_rank(ranked, {"zz"}) == 0.0
    assert metrics.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert metrics.percentile([3.0, 1.0, 2.0, 4.0], 95) == 4.0


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_json_on_a_tiny_catalog_is_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = {"type": "object", "properties": {}}
    cat = _write(tmp_path / "catalog.jsonl", [
        {"server": "Files", "name": "read_file", "description": "Read a file", "input_schema": schema},
        {"server": "Files", "name": "write_file", "description": "Write a file", "input_schema": schema},
        {"server": "Weather", "name": "get_forecast", "description": "Weather forecast for a city", "input_schema": schema},
    ])
    qs = _write(tmp_path / "queries.jsonl", [
        {"query": "weather forecast in Paris", "relevant": [{"server": "Weather", "name": "get_forecast"}]},
        {"query": "write file", "relevant": [{"server": "Files", "name": "write_file"}, {"server": "Files", "name": "read_file"}]},
    ])
    assert main(["--catalog", str(cat), "--queries", str(qs), "--k", "1,2", "--mode", "bm25", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tools"] == 3 and out["queries"] == 2 and set(out["modes"]) == {"bm25"}
    row = out["modes"]["bm25"]
    # query 1: forecast first (recall@1 = 1); query 2: write_file first, read_file second
    assert row["recall@1"] == pytest.approx((1 + 0.5) / 2)
    assert row["recall@2"] == pytest.approx(1.0)
    assert row["hit@1"] == 1.0 and row["mrr"] == 1.0 and row["ndcg@2"] == pytest.approx(1.0)


def test_eval_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "catalog.jsonl"
    bad.write_text("{not json\n")
    assert main(["--catalog", str(bad), "--queries", str(bad), "--mode", "bm25"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["--catalog", str(tmp_path / "missing.jsonl"), "--queries", str(bad)]) == 2
    with pytest.raises(SystemExit):
        main(["--catalog", str(bad), "--queries", str(bad), "--k", "0"])


@pytest.mark.parametrize("line", [
    {"query": "read", "relevant": ["Files/read_file"]},
    {"query": "read", "relevant": [None]},
    {"query": None, "relevant": [{"server": "Files", "name": "read_file"}]},
    {"query": "read", "relevant": [{"server": "Files"}]},
    {"query": "read", "relevant": [{"server": ["Files"], "name": "read_file"}]},
    {"query": "read", "relevant": [{"server": "Files", "name": "read_file"}], "principal": {"uid": 1000}},
    {"query": "read", "relevant": [{"server": "Files", "name": "read_file"}], "principal": ""},
])
def test_eval_names_a_malformed_query_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: dict[str, object]) -> None:
    """A queries (or feedback) line whose 'relevant' entries are not objects with string
    server and name, whose query is not a string or whose principal is not a non-empty string
    is a one-line error naming the file and line, exit 2, not a traceback (nor a "tool not in
    the catalog" warning about "Files/None", nor a principal named "{'uid': 1000}")."""
    cat = _write(tmp_path / "catalog.jsonl", [{"server": "Files", "name": "read_file", "description": "Read a file"}])
    qs = _write(tmp_path / "queries.jsonl", [{"query": "ok", "relevant": []}, line])
    assert main(["--catalog", str(cat), "--queries", str(qs), "--mode", "bm25"]) == 2
    assert f"{qs}:2: " in capsys.readouterr().err
    ok = _write(tmp_path / "ok.jsonl", [{"query": "ok", "relevant": []}])
    assert main(["--catalog", str(cat), "--queries", str(ok), "--feedback", str(qs), "--mode", "learned"]) == 2
    assert f"{qs}:2: " in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~3 s on 2 idle cores; generous for a loaded CI host
def test_eval_mode_all_on_mcptoolbenchpp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Every fourth query (175 of 699): every mode on the real catalog and queries, for a
    # seventh of the CPU (the whole set's figures are bench/README's, not a test's).
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(f"{line}\n" for line in (MCP / "queries.jsonl").read_text().splitlines()[::4]))
    rc = main([
        "--catalog", str(MCP / "catalog.jsonl"), "--queries", str(queries),
        "--k", "5", "--mode", "all", "--json",
    ])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tools"] == 49 and out["queries"] == 175
    assert set(out["modes"]) == MODES
    keys = {"recall@5", "ndcg@5", "hit@5", "mrr", "p50_ms", "p95_ms"}
    for mode, row in out["modes"].items():
        assert set(row) == keys, mode
        assert all(isinstance(v, float) for v in row.values())
        assert 0.0 <= row["recall@5"] <= row["hit@5"] <= 1.0 and 0.0 < row["mrr"] <= 1.0
        assert row["recall@5"] > 0.8, mode  # every mode is a working ranker on this easy set
    hybrid = out["modes"]["hybrid"]
    # without --feedback the learned ranker is the zero-shot one
    assert {k: v for k, v in out["modes"]["learned"].items() if "ms" not in k} == \
        {k: v for k, v in hybrid.items() if "ms" not in k}
    for branch in ("bm25", "dense"):
        assert hybrid["recall@5"] > out["modes"][branch]["recall@5"]
        assert hybrid["ndcg@5"] > out["modes"][branch]["ndcg@5"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_feedback_replays_into_the_learned_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = (MCP / "queries.jsonl").read_text().splitlines()
    (tmp_path / "feedback.jsonl").write_text("\n".join(lines[::2]) + "\n")
    (tmp_path / "held_out.jsonl").write_text("\n".join(lines[1::2]) + "\n")
    rc = main(["--catalog", str(MCP / "catalog.jsonl"), "--queries", str(tmp_path / "held_out.jsonl"),
               "--feedback", str(tmp_path / "feedback.jsonl"), "--k", "1,5", "--mode", "learned", "--json"])
    assert rc == 0
    learned = json.loads(capsys.readouterr().out)
    assert learned["feedback_events"] == sum(len(json.loads(x)["relevant"]) for x in lines[::2])
    rc = main(["--catalog", str(MCP / "catalog.jsonl"), "--queries", str(tmp_path / "held_out.jsonl"),
               "--k", "1,5", "--mode", "hybrid", "--json"])
    zero = json.loads(capsys.readouterr().out)
    assert learned["modes"]["learned"]["recall@1"] > zero["modes"]["hybrid"]["recall@1"] + 0.03
    assert learned["modes"]["learned"]["recall@5"] >= zero["modes"]["hybrid"]["recall@5"]


def test_eval_feedback_is_not_ignored_by_a_mode_that_cannot_use_it(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """--feedback with a --mode other than learned/all is exit 2 naming the fix, not zero-shot
    figures printed beside "feedback_events"; without --mode, --feedback evaluates learned."""
    cat = _write(tmp_path / "catalog.jsonl", [{"server": "Files", "name": "read_file", "description": "Read a file"},
                                              {"server": "Files", "name": "write_file", "description": "Write a file"}])
    qs = _write(tmp_path / "queries.jsonl", [{"query": "file", "relevant": [{"server": "Files", "name": "write_file"}]}])
    for mode in (["--mode", "hybrid"], ["--mode", "bm25"]):
        assert main(["--catalog", str(cat), "--queries", str(qs), "--feedback", str(qs), *mode, "--json"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert f"--feedback is replayed for mode learned only; --mode {mode[1]} would ignore it" in captured.err
    assert main(["--catalog", str(cat), "--queries", str(qs), "--feedback", str(qs), "--k", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["modes"]) == {"learned"} and out["feedback_events"] == 1
    assert out["modes"]["learned"]["recall@1"] == 1.0


def test_eval_feedback_for_tools_not_in_the_catalog_replays_no_events(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A feedback line naming a tool the catalog lacks makes no usage event: not counted in
    "feedback_events", and the warning says so (not "they count as misses", which is about
    queries); a feedback file of which no line names a catalog tool is exit 2."""
    cat = _write(tmp_path / "catalog.jsonl", [{"server": "Files", "name": "read_file", "description": "Read a file"},
                                              {"server": "Files", "name": "write_file", "description": "Write a file"}])
    qs = _write(tmp_path / "queries.jsonl", [{"query": "file", "relevant": [{"server": "Files", "name": "write_file"}]}])
    other = _write(tmp_path / "other.jsonl", [{"query": "weather", "relevant": [{"server": "Weather", "name": "forecast"}]}])
    assert main(["--catalog", str(cat), "--queries", str(qs), "--feedback", str(other), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"{other}: none of its lines names a tool of {cat}" in captured.err
    mixed = _write(tmp_path / "mixed.jsonl", [
        {"query": "file", "relevant": [{"server": "Files", "name": "write_file"}, {"server": "Weather", "name": "forecast"}]},
    ])
    assert main(["--catalog", str(cat), "--queries", str(qs), "--feedback", str(mixed), "--k", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["feedback_events"] == 1
    assert (f"warning: {mixed}: 1 of 1 feedback lines are not replayed in full: 1 relevant tool(s) not in the "
            "catalog (e.g. Weather/forecast); no usage event is made for those") in captured.err


def test_eval_refuses_an_empty_catalog_or_queries_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to evaluate is an error (exit 2), not a table of zeros with exit 0."""
    cat = _write(tmp_path / "catalog.jsonl", [{"server": "Files", "name": "read_file", "description": "Read a file"}])
    qs = _write(tmp_path / "queries.jsonl", [{"query": "read", "relevant": [{"server": "Files", "name": "read_file"}]}])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["--catalog", str(empty), "--queries", str(qs), "--mode", "bm25"]) == 2
    assert "empty.jsonl: holds no tools" in capsys.readouterr().err
    assert main(["--catalog", str(cat), "--queries", str(empty), "--mode", "bm25", "--json"]) == 2
    captured = capsys.readouterr()
    assert "empty.jsonl: holds no queries" in captured.err and captured.out == ""
    assert main(["--catalog", str(cat), "--queries", str(qs), "--feedback", str(empty), "--mode", "learned"]) == 2
    assert "empty.jsonl: holds no queries" in capsys.readouterr().err


def test_eval_warns_of_labels_that_can_never_score(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A relevant tool missing from the catalog (a queries file for another catalog) or an
    empty 'relevant' list is named on stderr; the JSON on stdout stays as it was."""
    cat = _write(tmp_path / "catalog.jsonl", [{"server": "Files", "name": "read_file", "description": "Read a file"}])
    qs = _write(tmp_path / "queries.jsonl", [
        {"query": "read a file", "relevant": [{"server": "Files", "name": "read_file"}]},
        {"query": "weather", "relevant": [{"server": "Weather", "name": "forecast"}]},
        {"query": "nothing", "relevant": []},
    ])
    assert main(["--catalog", str(cat), "--queries", str(qs), "--k", "1", "--mode", "bm25", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["modes"]["bm25"]["recall@1"] == 0.3333  # rounded to 4 places
    assert (f"warning: {qs}: 2 of 3 queries cannot score fully: 1 relevant tool(s) not in the catalog "
            "(e.g. Weather/forecast); 1 with an empty 'relevant' list") in captured.err
    clean = _write(tmp_path / "clean.jsonl", [{"query": "read", "relevant": [{"server": "Files", "name": "read_file"}]}])
    assert main(["--catalog", str(cat), "--queries", str(clean), "--mode", "bm25"]) == 0
    assert "warning" not in capsys.readouterr().err
