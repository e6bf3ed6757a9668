"""Rift: clustering math, margins, tokens and diagnoses (pure), and the CLI on real catalogs
with the packaged MiniLM embedder."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from toolatlas.rift.clusters import agglomerate, cohesion
from toolatlas.rift.report import analyse, risk_at_least, synthetic_query

BENCH = Path(__file__).resolve().parents[2] / ".." / "shared" / "benchdata"


class HashingEmbedder:
    """A small deterministic bag-of-words embedder (feature hashing, 512 dims): a real text
    embedding, just not a learned one, so the rift math can be checked exactly and fast."""

    name = query_name = "hashing-512"
    dim = 512

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1
        return out / norms

    embed_queries = embed


def unit(*rows: Sequence[float]) -> np.ndarray:
    v = np.array(rows, dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_agglomerate_average_linkage_threshold() -> None:
    # 0,1 nearly equal; 2 close to both; 3 alone; 4,5 a pair.
    v = unit([1, 0, 0, 0], [0.98, 0.2, 0, 0], [0.8, 0.6, 0, 0], [0, 0, 1, 0], [0, 0.1, 0, 1], [0, 0.2, 0, 1])
    assert agglomerate(v, 0.65) == [[0, 1, 2], [4, 5]]
    # a stricter theta keeps 2 out: its mean similarity to {0,1} is below 0.9
    assert agglomerate(v, 0.9) == [[0, 1], [4, 5]]
    assert cohesion(v, [0, 1]) == pytest.approx(float(v[0] @ v[1]))
    assert agglomerate(v[:1], 0.65) == []


def test_agglomerate_matches_reference_on_random_data() -> None:
    scipy = pytest.importorskip("scipy.cluster.hierarchy")
    from scipy.spatial.distance import pdist

    rng = np.random.default_rng(7)
    v = rng.normal(size=(120, 16)).astype(np.float32)
    for k in range(10):  # plant 10 groups of 3
        for c in range(3):
            v[20 + 3 * k + c] = v[k] + 0.15 * rng.normal(size=16)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    z = scipy.linkage(pdist(v.astype(np.float64), "cosine"), "average")
    labels = scipy.fcluster(z, t=1 - 0.65, criterion="distance")
    groups: dict[int, list[int]] = {}
    for i, lab in enumerate(labels):
        groups.setdefault(int(lab), []).append(i)
    ref = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))
    assert agglomerate(v, 0.65) == ref
    assert len(ref) >= 10


def test_synthetic_query_uses_name_and_arguments_not_summary() -> None:
    schema = {"properties": {"encoding": {"enum": ["utf8", "latin1"]}, "path": {}}, "required": ["path"]}
    assert synthetic_query("files__read_file", schema) == "read file path encoding utf8"
    assert synthetic_query("files__read_file", None) == "read file"


TOOLS = [
    ("files__read_file", "read file: return the contents of a text file at path"),
    ("files__read_text", "read text: return the decoded contents of a file at path"),  # near twin
    ("files__write_file", "write file: store the given contents into a file at path, replacing it"),
    ("web__fetch_url", "fetch url: download a web page over http and return its html"),
    ("mail__send_message", "send message: email a message to a recipient address with subject"),
]


def test_planted_duplicate_high_and_regenerate() -> None:
    dup = ("mirror__read_file", TOOLS[0][1])
    rep = analyse([*TOOLS, dup], HashingEmbedder(), theta=0.65)
    cl = next(c for c in rep.clusters if "mirror__read_file" in c.members)
    assert "files__read_file" in cl.members
    assert cl.risk == "high" and cl.worst_margin is not None and cl.worst_margin < 0.10
    assert rep.tools["mirror__read_file"].diagnosis == "REGENERATE"
    assert rep.tools["files__read_file"].diagnosis == "REGENERATE"
    assert rep.tools["mirror__read_file"].distinguishing == ()
    assert "web__fetch_url" not in rep.tools  # unclustered tools carry no diagnosis
    assert rep.counts()["high"] >= 1 and rep.fails("high") and rep.fails("medium")
    note = rep.note_for("mirror__read_file")
    assert note is not None and "files__read_file" in note and "does not tell them apart" in note
    assert rep.note_for("web__fetch_url") is None
    js = json.loads(json.dumps(rep.to_json()))
    assert "mirror__read_file" in js["regenerate"] and js["counts"]["high"] == rep.counts()["high"]


def test_ablation_without_margins_has_no_risk_labels() -> None:
    dup = ("mirror__read_file", TOOLS[0][1])
    rep = analyse([*TOOLS, dup], HashingEmbedder(), margin=False)
    assert rep.clusters and {c.risk for c in rep.clusters} == {"unrated"}
    assert rep.counts()["high"] == rep.counts()["medium"] == 0
    assert not rep.fails("high") and not rep.fails("medium")
    assert rep.note_for("mirror__read_file") is None
    # layer 3 still runs: the duplicate is still flagged for regeneration
    assert rep.tools["mirror__read_file"].diagnosis == "REGENERATE"
    assert "risks unrated" in rep.format_text()


def test_distinguishing_tokens_and_margin_thresholds() -> None:
    emb = HashingEmbedder()
    rep = analyse(TOOLS, emb, theta=0.5, schemas={"files__read_file": {"properties": {"path": {}}}})
    d = rep.tools["files__read_text"]
    assert d.diagnosis != "REGENERATE" and any(t.startswith("decod") for t in d.distinguishing)
    assert rep.tools["files__read_file"].query == "read file path"
    # risk follows the worst margin against the configured thresholds
    cl = rep.clusters[rep.tools["files__read_file"].cluster]
    wm = cl.worst_margin
    assert wm is not None
    lo = analyse(TOOLS, emb, theta=0.5, high=0.0, medium=0.0, schemas={"files__read_file": {"properties": {"path": {}}}})
    assert lo.clusters[lo.tools["files__read_file"].cluster].risk == ("low" if wm >= 0 else "high")
    hi = analyse(TOOLS, emb, theta=0.5, high=wm + 0.01, medium=wm + 0.02, schemas={"files__read_file": {"properties": {"path": {}}}})
    assert hi.clusters[hi.tools["files__read_file"].cluster].risk == "high"
    mid = analyse(TOOLS, emb, theta=0.5, high=wm - 0.01, medium=wm + 0.01, schemas={"files__read_file": {"properties": {"path": {}}}})
    assert mid.clusters[mid.tools["files__read_file"].cluster].risk == "medium"
    assert mid.note_for("files__read_text") is not None
    assert risk_at_least("medium", "medium") and not risk_at_least("low", "medium") and not risk_at_least("high", "never")


def test_precomputed_vectors_and_input_checks() -> None:
    emb = HashingEmbedder()
    vecs = emb.embed([t for _, t in TOOLS])
    a = analyse(TOOLS, emb, vectors=vecs)
    b = analyse(TOOLS, emb)
    assert a.to_json()["clusters"] == b.to_json()["clusters"]
    with pytest.raises(ValueError, match="unique"):
        analyse([TOOLS[0], TOOLS[0]], emb)
    with pytest.raises(ValueError, match="theta"):
        analyse(TOOLS, emb, theta=0)


# ----------------------------------------------------------------------------- CLI, real model


def _plant(tmp_path: Path) -> Path:
    rows = [json.loads(line) for line in (BENCH / "mcptoolbenchpp" / "catalog.jsonl").read_text().splitlines() if line.strip()]
    picks = [r for r in rows if r["name"] in ("read_file", "tavily-search", "playwright_navigate")]
    assert len(picks) == 3
    planted = [dict(r, server="mirror") for r in picks]
    out = tmp_path / "planted.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows + planted))
    return out


@pytest.mark.slow
def test_rift_cli_planted_duplicates_fail_on_and_ablation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from toolatlas.rift.cli import main

    cat = _plant(tmp_path)
    assert main(["--catalog", str(cat), "--json", "--fail-on", "high"]) == 1
    js = json.loads(capsys.readouterr().out)
    assert js["tools"] == 52
    by_member = {m["name"]: (c, m) for c in js["clusters"] for m in c["members"]}
    for tool in ("filesystem__read_file", "tavily-mcp__tavily-search", "playwright__playwright_navigate"):
        server, name = tool.split("__")
        c, m = by_member[tool]
        assert f"mirror__{name}" in [x["name"] for x in c["members"]]
        assert c["risk"] == "high", tool
        assert m["diagnosis"] == "REGENERATE" and by_member[f"mirror__{name}"][1]["diagnosis"] == "REGENERATE"
    assert main(["--catalog", str(cat), "--fail-on", "never"]) == 0
    text = capsys.readouterr().out
    assert "HIGH" in text and "REGENERATE" in text

    # the ablation's clusters are unrated: a gate on them could never fail, so asking for one is
    # a usage error (it passed silently), and without --fail-on it is no gate
    with pytest.raises(SystemExit) as gate:
        main(["--catalog", str(cat), "--json", "--no-margin", "--fail-on", "medium"])
    assert gate.value.code == 2 and "--no-margin leaves clusters without a risk" in capsys.readouterr().err
    assert main(["--catalog", str(cat), "--json", "--no-margin"]) == 0
    abl = json.loads(capsys.readouterr().out)
    assert abl["counts"]["high"] == abl["counts"]["medium"] == 0 and abl["counts"]["unrated"] == len(abl["clusters"]) > 0
    assert {c["risk"] for c in abl["clusters"]} == {"unrated"}


@pytest.mark.slow
def test_rift_cli_on_live_config_through_cards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from toolatlas.catalog.cards_cli import keygen_main
    from toolatlas.catalog.cards_cli import main as cards_main
    from toolatlas.rift.cli import main

    from tests.support.configs import write_carded_testserver_config
    from tests.support.daemon import seed_shared_models

    assert keygen_main(["--out", str(tmp_path / "op.key")]) == 0
    cfg = write_carded_testserver_config(tmp_path)
    # the suite's one ONNX export, as the daemon tests use: this tests Rift, not a first export
    # (which took 23 s here, 71 s beside a CPU hog and over the 300 s limit on a busier host)
    seed_shared_models(tmp_path / "state")
    assert cards_main(["generate", "--config", str(cfg), "--quiet"]) == 0
    capsys.readouterr()
    # gen_000..gen_002 differ only by a number: the index cannot tell them apart
    assert main(["--config", str(cfg), "--json"]) == 1
    js = json.loads(capsys.readouterr().out)
    assert js["text"] == "cards" and js["quarantined_tools"] == 0
    by_member = {m["name"]: (c, m) for c in js["clusters"] for m in c["members"]}
    c, m = by_member["test__gen_000"]
    assert {"test__gen_001", "test__gen_002"} <= {x["name"] for x in c["members"]}
    assert c["risk"] == "high" and m["diagnosis"] == "REGENERATE"


@pytest.mark.parametrize("limit", ["-1", "x"])
def test_rift_cli_refuses_a_negative_or_junk_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: str) -> None:
    """--limit -1 printed every cluster but the last and "... 2 more clusters" for a report of
    one: a usage error (exit 2) naming the option instead."""
    from toolatlas.rift.cli import main

    cat = tmp_path / "c.jsonl"
    cat.write_text('{"server": "s", "name": "a", "description": "read a file"}\n')
    with pytest.raises(SystemExit) as exc:
        main(["--catalog", str(cat), "--limit", limit])
    assert exc.value.code == 2
    assert "--limit" in capsys.readouterr().err


def test_agglomerate_scans_a_row_a_step_on_a_dense_component(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server of thousands of near-identical tools is one component: the linkage must read
    O(m^2) similarities in all, not the whole m x m matrix again at each of its m merges (the
    daemon re-ran that cubic loop at every catalog change). Counted, not timed: every element
    np.argmax looks at. The result still matches the merge-the-closest-pair reference."""
    rng = np.random.default_rng(3)
    m = 300
    v = rng.normal(size=16) + 0.5 * rng.normal(size=(m, 16))
    v = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    scanned = [0]
    argmax = np.argmax

    def counting(a: Any, *args: Any, **kw: Any) -> Any:
        scanned[0] += np.size(a)
        return argmax(a, *args, **kw)

    monkeypatch.setattr(np, "argmax", counting)
    groups = agglomerate(v, 0.65)
    assert groups and scanned[0] <= 10 * m * m, scanned[0]
    monkeypatch.undo()
    scipy = pytest.importorskip("scipy.cluster.hierarchy")
    from scipy.spatial.distance import pdist

    labels = scipy.fcluster(scipy.linkage(pdist(v.astype(np.float64), "cosine"), "average"), t=1 - 0.65, criterion="distance")
    ref: dict[int, list[int]] = {}
    for i, lab in enumerate(labels):
        ref.setdefault(int(lab), []).append(i)
    assert groups == sorted((g for g in ref.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))


def test_analyse_steps_once_a_member_in_a_cluster_of_look_alikes() -> None:
    """Layer 3 compared each member's tokens and query with every sibling in Python: a
    cluster of m look-alike tools took m^2 steps (2000 tools: 5 s). Counted, not timed: the
    lines report.py executes for a 200-tool cluster stay linear in m, and the diagnoses are
    what they were (nearest sibling, own tokens, margins)."""
    import sys

    import toolatlas.rift.report as report

    m = 200
    tools = [(f"s__get_item_{i}", f"Get an item from the store by id and name, variant v{i}") for i in range(m)]
    lines = [0]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != report.__file__:
            return None
        if event == "line":
            lines[0] += 1
        return trace

    sys.settrace(trace)
    try:
        rep = analyse(tools, HashingEmbedder(), theta=0.5)
    finally:
        sys.settrace(None)
    assert len(rep.clusters) == 1 and len(rep.clusters[0].members) == m
    assert lines[0] <= 200 * m, lines[0]  # about 70 m now (tokens and query of each tool); 660 m before
    d = rep.tools["s__get_item_7"]
    assert d.distinguishing == ("v7",) and d.diagnosis in ("OK", "SHARPEN") and d.margin is not None
    assert d.confused_with in rep.clusters[0].members and d.confused_with != "s__get_item_7"


def test_rift_cli_names_the_tool_two_servers_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Servers 'a__b' and 'a' with tools 'c' and 'b__c' both namespace to 'a__b__c': the CLI
    said only 'tool names must be unique', leaving the user to search the catalog."""
    from toolatlas.rift.cli import main

    cat = tmp_path / "c.jsonl"
    cat.write_text('{"server": "a__b", "name": "c", "description": "x"}\n{"server": "a", "name": "b__c", "description": "y"}\n')
    assert main(["--catalog", str(cat), "--embedder", "onnx"]) == 2
    assert "two tools are named 'a__b__c'" in capsys.readouterr().err


def test_rift_cli_on_a_config_whose_every_tool_is_quarantined_is_no_pass(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`[cards] required = true` and no card written yet: every tool is quarantined, Rift had
    0 tools to analyse and exited 0 under --fail-on high (a CI gate passing over nothing).
    Now a usage error naming why, before any model is loaded."""
    from toolatlas.catalog.cards_cli import keygen_main
    from toolatlas.rift.cli import main

    from tests.support.configs import write_carded_testserver_config

    assert keygen_main(["--out", str(tmp_path / "op.key")]) == 0
    cfg = write_carded_testserver_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("[cards]\n", "[cards]\nrequired = true\n"))
    capsys.readouterr()
    assert main(["--config", str(cfg), "--fail-on", "high"]) == 2
    err = capsys.readouterr().err
    assert "no tool to analyse: all" in err and "quarantined" in err and "toolatlas cards generate" in err, err
