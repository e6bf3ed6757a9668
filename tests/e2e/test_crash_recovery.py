"""Crash recovery of the persisted index (issue 6, "Losing nothing"), on a real daemon with the
real ONNX embedder and a 308-tool upstream, all restarts sharing one state_dir.

1. SIGKILL during a reindex: a burst of run-time catalog changes (add_tool / remove_tool on
   the upstream) keeps the index updating and persisting; the daemon is killed once the
   index version has moved (a different number of updates in each round), restarted on the
   same state_dir, and must serve exactly the live catalog: the upstream's tools, every one
   findable by a search for its own name, none of the burst's leftovers counted.
2. Each persisted file under state_dir is corrupted or truncated in turn: the restart logs
   that it detected it, rebuilds, serves the whole catalog, and leaves a valid file behind.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.processes import descendants, kill_all
from toolatlas.retrieval import persist

pytestmark = pytest.mark.slow

N_GEN = 300


def _live_catalog() -> list[str]:
    """What the upstream lists after a fresh start: the test server built the same way."""
    import anyio

    from tests.support.servers.testserver import build

    return sorted(f"big__{t.name}" for t in anyio.run(build(tools=N_GEN).list_tools))


LIVE = _live_catalog()
STALE_SEEN: dict[str, int] = {}  # restart round -> index tool count once settled (see the stale test)
ONNX = 'embedder = "onnx"\n'
UPSTREAM = stdio_testserver("big", "--tools", str(N_GEN)) + "relist_interval = 0\n"
KILL_AFTER_UPDATES = (1, 3, 6)  # a different moment in each round
CORRUPT_MARKERS = ("corrupt", "failed its checksum", "hnsw_load_failed", "rebuild")


class Runs:
    """Daemons started one after another on the same folder (same socket, same state_dir)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.n = 0
        self.current: Daemon | None = None

    def start(self) -> Daemon:
        self.cleanup()  # never leave an earlier daemon running (a failed test may have)
        self.n += 1
        d = Daemon(self.tmp, UPSTREAM, search_extra=ONNX)
        d.log = self.tmp / f"daemon-{self.n}.log"
        self.current = d
        return d.start(wait_ready=300)

    def kill(self, d: Daemon) -> None:
        """SIGKILL the daemon, then its orphaned children (as a dead daemon cannot)."""
        assert d.proc is not None
        kids = descendants(d.proc.pid)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=30)
        d._logfh.close()
        kill_all(kids)

    def cleanup(self) -> None:
        d = self.current
        if d is not None and d.proc is not None and d.proc.poll() is None:
            d.__exit__(None, None, None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    r = Runs(tmp_path_factory.mktemp("crash"))
    try:
        yield r
    finally:
        r.cleanup()


def retrieval_dir(runs: Runs) -> Path:
    return persist.folder(runs.tmp / "state" / "index")


def serves_live_catalog(d: Daemon, round_name: str = "") -> None:
    """Every tool of the live catalog is served and found by a search for its own name."""
    def settled() -> bool:
        st = d.status()
        big = st["servers"][0]
        idx = st["index"]
        return (big["state"] == "ready" and big["tools"] == len(LIVE) and st["tools"] == len(LIVE)
                and (idx["dense_index"] or {}).get("live", 0) >= len(LIVE) and idx["degraded"] is None)

    d.wait_for(settled, 120, f"the {len(LIVE)} live tools served")
    missing: list[str] = []
    with d.client() as c:
        for name in LIVE:
            query = name.split("__", 1)[1]
            r = c.call_tool("tool_search", {"query": query, "top_k": 5})
            assert not r.get("isError"), r
            if name not in [m["name"] for m in r["structuredContent"]["matches"]]:
                missing.append(name)
    assert not missing, f"{len(missing)} live tools not found by their own name: {missing[:10]}"
    if round_name:
        STALE_SEEN[round_name] = d.status()["index"]["tools"]


def burst(d: Daemon, round_no: int, stop: threading.Event) -> None:
    """Catalog changes, paced so that the daemon applies them as several index updates, until
    the daemon dies or `stop` is set (at most N_GEN changes)."""
    try:
        with d.client() as c:
            for j in range(N_GEN):
                if stop.wait(0.02):
                    return
                if j % 2:
                    c.call_tool("big__remove_tool", {"name": f"gen_{j:03d}"})
                else:
                    c.call_tool("big__add_tool", {"name": f"burst_{round_no}_{j}",
                                                  "description": f"Burst tool {j} of round {round_no}: folds paper cranes."})
    except (OSError, ConnectionError, ValueError):
        pass  # the daemon was killed under us


def test_sigkill_during_reindex_then_restart_serves_the_live_catalog(runs: Runs) -> None:
    d = runs.start()
    serves_live_catalog(d)  # the cold index (the ONNX export comes from the shared cache)
    mid_write_kills = 0
    for round_no, after in enumerate(KILL_AFTER_UPDATES):
        v0 = d.status()["index"]["version"]
        stop = threading.Event()
        t = threading.Thread(target=burst, args=(d, round_no, stop), daemon=True)
        t.start()
        d.wait_for(lambda: d.status()["index"]["version"] >= v0 + after, 60, f"{after} index updates")
        runs.kill(d)
        stop.set()
        t.join(30)
        # A kill inside a write leaves its temp file behind (atomic_write never got to unlink it).
        leftovers = [p.name for p in retrieval_dir(runs).iterdir() if p.name.endswith(".tmp")]
        mid_write_kills += bool(leftovers)
        d = runs.start()
        serves_live_catalog(d, f"round {round_no}, killed after {after} updates")
        log = d.log.read_text()
        assert "Traceback" not in log, log[-3000:]
        # the dead writer's temp files are removed at start (the new daemon's own may be in flight)
        mine = f".{d.proc.pid}.tmp"
        assert not [n for n in leftovers if (retrieval_dir(runs) / n).exists()], leftovers
        assert not [p.name for p in retrieval_dir(runs).iterdir() if p.name.endswith(".tmp") and not p.name.endswith(mine)]
        if leftovers:
            assert "stale_temps_removed" in log
    print(f"kills that landed inside a write: {mid_write_kills} of {len(KILL_AFTER_UPDATES)}")
    assert d.stop() == 0


def test_after_the_sigkill_restarts_the_index_holds_no_stale_tools(runs: Runs) -> None:
    assert STALE_SEEN, "runs after the SIGKILL test"
    assert all(n == len(LIVE) for n in STALE_SEEN.values()), (
        f"index tool count after each restart vs {len(LIVE)} live tools: {STALE_SEEN}")


def _truncate(path: Path) -> str:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "truncated"


def _flip(path: Path) -> str:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(len(data), mid + 64)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return "flipped 64 bytes"


def _empty(path: Path) -> str:
    path.write_bytes(b"")
    return "emptied"


CORRUPTIONS = {"embeddings": _truncate, "snapshot": _flip, "hnsw": _truncate}


def _valid(folder: Path, kind: str, model: str) -> bool:
    state = folder.parent
    snap = persist.load_snapshot(state, model)  # raises CorruptFile when invalid
    if kind == "hnsw":
        return snap is not None and snap.hnsw_path is not None
    if kind == "embeddings":
        return len(persist.load_embeddings(state, model, 384)) >= len(LIVE)
    return snap is not None and sorted(doc.name for doc in snap.docs) == LIVE


@pytest.mark.parametrize("kind", [
    "embeddings",
    "snapshot",
    "hnsw",
])
def test_corrupt_state_file_is_detected_logged_and_rebuilt(runs: Runs, kind: str) -> None:
    folder = retrieval_dir(runs)
    runs.cleanup()  # a daemon left running by a failed test before
    if runs.current is None:  # run on its own: build the state first
        d0 = runs.start()
        serves_live_catalog(d0)
        assert d0.stop() == 0
    target = next(folder.glob(f"{kind}-*"))
    how = CORRUPTIONS[kind](target)
    d = runs.start()
    serves_live_catalog(d)
    model = d.status()["index"]["embedder"]
    assert d.stop() == 0
    log = d.log.read_text()
    lines = [ln for ln in log.splitlines() if target.name in ln or any(m in ln for m in CORRUPT_MARKERS)]
    assert lines, f"{target.name} was {how} but the restart logged nothing about it:\n{log[-3000:]}"
    assert _valid(folder, kind, model), f"{target.name} was not rewritten valid after the rebuild"
