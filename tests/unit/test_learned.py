"""The learned stage's pure parts (guard, per-principal bounds, decay) and the usage store
(SQLite in a real file: mode, crash safety under SIGKILL, a second writer noticed)."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from toolatlas.retrieval import fusion
from toolatlas.retrieval import learned as L
from toolatlas.retrieval.usage import SqliteUsageStore, UsageEvent


def test_guard_keeps_cold_tools_at_their_zero_shot_rank() -> None:
    zero = [0, 1, 2, 3, 4]
    fed = np.array([False, False, True, False, False, True, True])
    # the learned order wants the fed tools 5 and 6 first: cold 0, 1, 3, 4 keep their ranks
    assert fusion.guard([5, 6, 2, 0, 1, 3, 4], zero, fed) == [0, 1, 5, 3, 4, 6, 2]
    # a fed tool boosted past cold ones waits for the first slot no cold tool is owed
    assert fusion.guard([2, 0, 1, 3, 4], zero, fed) == [0, 1, 2, 3, 4]
    # no cold tool in the zero-shot top: the learned order stands
    assert fusion.guard([2, 5, 6], [2, 5, 6], fed) == [2, 5, 6]
    # a repeat of the very query goes first; the cold ones keep their order after it
    strong = np.array([False] * 6 + [True])
    assert fusion.guard([6, 0, 1, 3, 4], zero, fed, strong) == [6, 0, 1, 3, 4]


def _ev(query: str, tool: str, principal: str, vec: np.ndarray | None = None, at: float = 0.0) -> UsageEvent:
    return UsageEvent(query=query, tool=tool, principal=principal, at=at, vector=vec)


def _rank(state: L.LearnedState, names: list[str], base: np.ndarray, query: str, qvec: np.ndarray | None,
          principal: str) -> list[str]:
    pos_of = {n: i for i, n in enumerate(names)}
    pos, _ = L.rerank(state, state.positions(1, pos_of), base, np.arange(len(names)), L.tokenize(query), qvec,
                      principal, len(names))
    return [names[i] for i in pos]


BASE = np.array([3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0], dtype=np.float32)  # zero-shot scores of seven tools


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_one_other_principal_never_moves_a_ranking_two_agreeing_do() -> None:
    names = ["a", "b", "c", "d", "e", "f", "g"]
    q = _unit(np.random.default_rng(0).normal(size=8))
    flood = [_ev("frobnicate the gizmo", "g", "mallory", q) for _ in range(500)]
    alone = L.build_state(flood, now=0.0)
    zero = _rank(L.empty_state(), names, BASE, "frobnicate the gizmo", q, "alice")
    assert zero == names
    assert _rank(alone, names, BASE, "frobnicate the gizmo", q, "alice") == zero
    # the flooder's own ranking learned it (a repeat of its query): first
    assert _rank(alone, names, BASE, "frobnicate the gizmo", q, "mallory")[0] == "g"
    agreed = L.build_state(flood + [_ev("frobnicate the gizmo", "g", "bob", q)], now=0.0)
    assert _rank(agreed, names, BASE, "frobnicate the gizmo", q, "alice")[0] == "g"


def test_others_agree_over_the_nearest_past_queries_not_only_the_voting_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bob's past query is this one; Carol used the same tool after a query only loosely like
    it (beyond the KNN that vote, within AGREE_K); Dave's queries in between led elsewhere."""
    names = ["a", "b", "c", "d", "e", "f", "g"]
    axes = np.eye(8, dtype=np.float32)
    q = axes[0]
    dave = [_ev(f"dave asks {i}", "f", "dave", _unit(0.8 * q + 0.6 * axes[1 + i % 6])) for i in range(L.KNN + 5)]
    bob = _ev("frobnicate the gizmo", "g", "bob", q)
    carol = _ev("polish widgets", "g", "carol", _unit(0.5 * q + 0.87 * axes[7]))
    agreed = L.build_state(dave + [bob, carol], now=0.0)
    assert _rank(agreed, names, BASE, "frobnicate the gizmo", q, "alice")[0] == "g"
    assert _rank(L.build_state(dave + [bob], now=0.0), names, BASE, "frobnicate the gizmo", q, "alice") == names
    monkeypatch.setattr(L, "AGREE_K", L.KNN)  # agreement among the voting rows alone: Carol is too far
    assert _rank(agreed, names, BASE, "frobnicate the gizmo", q, "alice") == names


def test_old_events_weigh_less() -> None:
    q = np.ones(4, dtype=np.float32) / 2.0
    day = 86400.0
    state = L.build_state([_ev("x y", "a", "p", q, at=0.0), _ev("x z", "b", "p", q, at=60 * day)], now=60 * day)
    rows = {state.tools[next(iter(t))]: float(w) for t, w in zip(_row_tools(state), state.weight)}
    assert rows["b"] == 1.0 and abs(rows["a"] - 0.25) < 1e-6  # two half-lives


def test_store_round_trip_mode_and_a_second_writer(tmp_path: Path) -> None:
    path = tmp_path / "state" / "learning.sqlite3"
    store = SqliteUsageStore(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    vec = np.linspace(-1, 1, 384).astype(np.float32)
    ids = store.add([_ev("add a note", "notes__add_note", "uid:1", at=100.0), _ev("old", "x__y", "uid:1", at=1.0)])
    store.set_vectors(ids[:1], vec[None, :], "space")
    got = store.events()
    assert [e.tool for e in got] == ["notes__add_note", "x__y"]
    assert got[0].space == "space" and np.allclose(got[0].vector, vec, atol=1e-3) and got[1].vector is None
    assert store.prune(50.0) == 1 and len(store.events()) == 1
    assert not store.changed_elsewhere()
    other = SqliteUsageStore(path)  # what `toolatlas learning forget` does while the daemon runs
    assert other.forget_tool("notes__add_note") == 1
    other.close()
    assert store.changed_elsewhere() and store.events() == []
    assert not store.changed_elsewhere()
    store.close()


_WRITER = """
import sys, time
from toolatlas.retrieval.usage import SqliteUsageStore, UsageEvent
store = SqliteUsageStore(sys.argv[1])
i = 0
while True:
    store.add([UsageEvent(query=f"q{i}", tool="t__x", principal="uid:1", at=time.time())])
    i += 1
    print(i, flush=True)
"""


def test_a_sigkilled_writer_loses_nothing_committed_and_never_corrupts(tmp_path: Path) -> None:
    path = tmp_path / "learning.sqlite3"
    total = 0
    for _round in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ))
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        committed = 0
        while committed < 50 and time.monotonic() < deadline:
            committed = int(proc.stdout.readline() or 0) or committed
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        assert committed >= 50
        total += committed
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db.close()
        store = SqliteUsageStore(path)
        # every event the writer saw committed (it printed after COMMIT) is there
        assert len(store.events()) >= total
        store.close()


def test_feedback_events_are_counted_by_outcome() -> None:
    import pytest

    from toolatlas.metrics import Metrics

    m = Metrics()
    m.count_feedback("recorded")
    m.count_feedback("recorded")
    m.count_feedback("call_failed")
    text = m.expose()[0].decode()
    assert 'toolatlas_feedback_events_total{outcome="recorded"} 2.0' in text
    assert 'toolatlas_feedback_events_total{outcome="call_failed"} 1.0' in text
    with pytest.raises(ValueError, match="feedback outcome"):
        m.count_feedback("made_up")


def test_a_tool_used_once_keeps_its_zero_shot_rank_among_much_used_ones() -> None:
    names = ["once", "b", "c", "d", "e", "f", "g"]
    rng = np.random.default_rng(1)
    q = _unit(rng.normal(size=8))
    far = rng.normal(size=8)
    far = _unit(far - (far @ q) * q)  # orthogonal: its past query never votes for this one
    near = _unit(0.7 * q + 0.71 * far)  # cosine 0.7: votes, but no repeat (STRONG_SIM)
    busy = [_ev(f"list the records {i}", t, "me", near) for i in range(30) for t in ("f", "g")]
    busy += [_ev(f"other errands {i}", t, "me", -far) for i in range(30) for t in ("b", "c", "d", "e")]
    once = _ev("an unrelated errand", "once", "me", -far)
    # one use among tools used 30 times: guarded as if unused, while f and g pass the others
    state = L.build_state(busy + [once], now=0.0)
    assert list(state.weak()) == [name == "once" for name in state.tools]
    uncounted = replace(state, tool_events=(), _weak=[])  # a state without counts judges none weak
    assert uncounted.weak().shape == (len(state.tools),) and not uncounted.weak().any()
    assert _rank(state, names, BASE, "show me the records", q, "me")[:3] == ["once", "f", "g"]
    # as many uses as the others: judged by the past queries like them, and passed
    state = L.build_state(busy + [_ev(f"an unrelated errand {i}", "once", "me", -far) for i in range(30)], now=0.0)
    assert not state.weak().any()
    assert _rank(state, names, BASE, "show me the records", q, "me")[:3] == ["f", "g", "once"]


def test_feedback_never_brings_in_a_tool_outside_the_callers_scope() -> None:
    names = ["a", "b", "c", "d"]
    q = np.ones(4, dtype=np.float32) / 2.0
    state = L.build_state([_ev("open the vault", "d", "me", q) for _ in range(50)], now=0.0)
    pos_of = {n: i for i, n in enumerate(names)}
    allowed = np.array([0, 1, 2])  # the caller may not use d
    pos, _ = L.rerank(state, state.positions(1, pos_of), np.array([1.0, 0.5, 0.2], dtype=np.float32), allowed,
                      L.tokenize("open the vault"), q, "me", 4)
    assert [names[i] for i in pos] == ["a", "b", "c"]
    # in scope, the same feedback puts it first
    pos, _ = L.rerank(state, state.positions(1, pos_of), np.array([1.0, 0.5, 0.2, 0.1], dtype=np.float32),
                      np.arange(4), L.tokenize("open the vault"), q, "me", 4)
    assert names[pos[0]] == "d"


def test_a_published_state_never_changes_as_events_arrive() -> None:
    # copy on write: the index shares its per-row and per-tool dicts with published states
    rng = np.random.default_rng(1)
    q = rng.normal(size=8).astype(np.float32)
    q /= np.linalg.norm(q)
    idx = L.LearningIndex()
    idx.add([_ev("open the vault", "a", "p", q), _ev("open the vault", "a", "r", q)])
    first = idx.state(0.0)
    before = [x.tolist() for x in L.signals(first, L.tokenize("open the vault"), q, "p")]
    lex_before = first.lexical(0).scores(L.tokenize("vault door")).tolist()
    # the same query by the same principals for a new tool, new words, a third principal
    idx.add([_ev("open the vault", "b", "p", q), _ev("open the vault door", "a", "p", q),
             _ev("open the vault", "a", "s", q)])
    second = idx.state(0.0)
    assert [x.tolist() for x in L.signals(first, L.tokenize("open the vault"), q, "p")] == before
    assert first.lexical(0).scores(L.tokenize("vault door")).tolist() == lex_before
    # one row per principal's query: p's row got tool b after `first` was published
    assert _row_tools(first) == [{0: 1}, {0: 1}] and first.events == 2
    assert _row_tools(second) == [{0: 1, 1: 1}, {0: 1}, {0: 1}, {0: 1}] and second.events == 5
    idx.add([_ev("open the vault", "b", "p", q), _ev("open the vault", "b", "p", q)])
    assert _row_tools(idx.state(0.0)) == [{0: 1, 1: 3}, {0: 1}, {0: 1}, {0: 1}]
    assert _row_tools(second)[0] == {0: 1, 1: 1}
    vote, _cover, repeat = L.signals(second, L.tokenize("open the vault"), q, "p")
    assert vote[1] > 0 and repeat.tolist() == [True, True]


def _row_tools(state: L.LearnedState) -> list[dict[int, int]]:
    return [dict(state.row_tools.of(r)) for r in range(state.rows)]


def test_past_queries_live_once_in_hnswlib_above_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    # above HNSW_MIN_EVENTS rows the index keeps no exact-scan copy of the vectors: hnswlib
    # holds their principal coordinates and the neighbours are scored on 8-bit rows; they are
    # those of an exact scan (a small set: hnswlib is exact), their similarities within the
    # 8-bit rows' error
    monkeypatch.setattr(L, "HNSW_MIN_EVENTS", 64)
    rng = np.random.default_rng(2)
    vecs = rng.normal(size=(200, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    idx = L.LearningIndex()
    idx.add([_ev(f"query {i}", f"t{i % 7}", "p", vecs[i]) for i in range(40)])
    small = idx.state(0.0)
    assert small.hnsw is None and small.vecs.shape == (40, 16)
    idx.add([_ev(f"query {i}", f"t{i % 7}", "p", vecs[i]) for i in range(40, 150)])
    idx.add([_ev("no vector yet", "t0", "p")])
    big = idx.state(0.0)
    assert big.hnsw is not None and big.vecs.shape == (0, 16) and big.rows == 150 and idx.missing == 1
    idx.add([_ev(f"query {i}", f"t{i % 7}", "p", vecs[i]) for i in range(150, 200)])  # after publishing
    for q in vecs[::9]:
        rows, sims = L.neighbours(big, q, 10)
        exact = vecs[:150] @ q
        want = np.argsort(-exact, kind="stable")[:10]
        assert rows.max() < 150  # rows added later are not seen
        # the exact ten, in order but for ties closer than the 8-bit error
        assert np.abs(exact[rows] - exact[want]).max() < 0.005 and len(set(rows.tolist())) == 10
        assert np.abs(sims - exact[rows]).max() < 0.005 and sims.max() <= 1.0
        rows, _ = L.neighbours(small, q, 10)  # the older state still scans its own array
        assert rows.tolist() == np.argsort(-(vecs[:40] @ q), kind="stable")[:10].tolist()


def test_agreeing_principals_words_count_by_use_up_to_a_cap() -> None:
    # what other principals' past queries add to a tool's lexical document: only words two or
    # more of them used, each principal's uses counted up to OTHER_WORD_CAP
    events = [_ev("open vault", "x", "a") for _ in range(10)] + [_ev("open vault", "x", "b")]
    events += [_ev("close door", "y", "a"), _ev("close door", "y", "b"), _ev("secret", "y", "a")]
    state = L.build_state(events, now=0.0)
    cap = L.OTHER_WORD_CAP
    want = L.Bm25Index([sorted(["open", "vault"] * (cap + 1)), ["close", "close", "door", "door"]])
    for query in ("open vault", "close the door", "secret"):
        toks = L.tokenize(query)
        assert state.lexical(-1).scores(toks).tolist() == want.scores(toks).tolist()
    # a's own ranking sees all of a's words, "secret" included
    assert state.lexical(state.principals["a"]).scores(["secret"])[1] > 0


def test_a_scoped_status_dates_the_feedback_in_its_scope_not_elsewhere() -> None:
    """catalog_status for a caller limited to some servers counts only their tools' feedback;
    its `updated_at` was the latest event anywhere, a use of a tool that caller may not see."""
    from toolatlas.gateway.learning import status_section
    from toolatlas.retrieval.engine import Engine

    vec = np.zeros(4, dtype=np.float32)
    vec[0] = 1.0
    events = [UsageEvent(query="add a note", tool="notes__add_note", principal="uid:1", at=1_700_000_000.0, vector=vec),
              UsageEvent(query="pay the bill", tool="billing__pay", principal="uid:2", at=1_700_086_400.0, vector=vec)]
    eng = Engine(state_dir=None)
    eng.set_learned(L.build_state(events, now=1_700_090_000.0))
    everything = status_section(eng, True, None)
    assert everything["events"] == 2 and everything["updated_at"] == "2023-11-15T22:13:20Z"
    notes = status_section(eng, True, None, frozenset({"notes"}))
    assert notes["events"] == 1 and notes["tools_with_feedback"] == 1
    assert notes["updated_at"] == "2023-11-14T22:13:20Z"  # the notes event's day, not the bill's
    assert status_section(eng, True, None, frozenset({"weather"}))["updated_at"] is None
