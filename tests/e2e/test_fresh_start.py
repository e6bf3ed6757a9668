"""A daemon's first minutes (#16 item 4): upstreams start at once, BM25 search serves while the
embedding model is exported into a fresh state_dir, dense search joins without a restart; a
tool of an upstream still connecting is "starting, retry", never "unknown"; tools/list before
the first index carries no cache hint and list_changed hands clients over to the meta-tools.

Two gates keep this deterministic without timing: a stdio upstream wrapped in a shell loop
that waits for a file before it execs the test server (it stays "connecting" until then), and
the documented test knob TOOLATLAS_TEST_HOLD_EXPORT, which holds the real ONNX export until a
file exists."""

from __future__ import annotations

import io
import signal
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.results import text
from tests.support.servers import testserver_args
from toolatlas.examples.run_example import report_startup
from toolatlas.retrieval.embed import HOLD_EXPORT_ENV
from toolatlas.surface.unix import unix_client

META = ["tool_search", "execute_tool", "catalog_status"]
EXPORT = Path("index") / "models" / "minilm-l6-v2-onnx-v2" / "manifest.json"


def gated_upstream(name: str, gate: Path, connect_s: int = 300) -> str:
    """A stdio test server that only starts once `gate` exists: "connecting" until then."""
    script = f'while [ ! -e "{gate}" ]; do sleep 0.05; done; exec "$0" "$@"'
    args = json.dumps(["-c", script, sys.executable, *testserver_args("--name", name)])
    return (f'[[upstream]]\nname = "{name}"\ntransport = "stdio"\ncommand = "sh"\nargs = {args}\n'
            f"timeouts = {{ connect = {connect_s} }}\n")


def cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolatlas", *args, "--socket", d.socket],
                          capture_output=True, text=True, timeout=60)


def _names(listed: types.ListToolsResult) -> list[str]:
    return [t.name for t in listed.tools]


async def test_before_the_first_index_calls_are_told_to_retry_and_lists_are_not_cached(tmp_path: Path) -> None:
    gate = tmp_path / "slow-may-start"
    d = Daemon(tmp_path, stdio_testserver("fast") + gated_upstream("slow", gate))
    with d.start(ready=False):
        d.wait_for(lambda: {s["name"]: s["tools"] for s in d.status()["servers"]}["fast"] > 0, 60, "fast listed")
        st = d.status()
        assert st["index"]["ready"] is False
        assert any(w.startswith("upstream slow: connecting (") for w in st["waiting_for"]), st["waiting_for"]

        # A tool of the upstream still connecting: told to retry, never called unknown.
        r = d.tool("execute_tool", {"name": "slow__echo", "arguments": {"message": "x"}})
        assert r["isError"]
        assert "is starting" in text(r) and "retry in 2 s" in text(r) and "unknown" not in text(r), text(r)
        # A tool of an upstream that listed is called normally before the index is ready.
        r = d.tool("fast__echo", {"message": "early"})
        assert not r.get("isError") and text(r) == "Echo: early"

        # The CLI says the daemon is starting (exit 75), not "no matching tools" with exit 0.
        out = cli(d, "search", "qwertyuiop zxcvbnm")
        assert out.returncode == 75, out
        assert "still starting" in out.stderr and "upstream slow: connecting" in out.stderr
        assert "no matching tools" not in out.stdout
        out = cli(d, "status")
        assert out.returncode == 0 and "waiting for:\n  upstream slow: connecting (" in out.stdout, out.stdout
        # What `make run` prints meanwhile (examples/run_example.py), until nothing is awaited.
        report = io.StringIO()
        assert d.proc is not None
        reporter = threading.Thread(target=report_startup, args=(d.socket, d.proc, report), daemon=True)
        reporter.start()
        d.wait_for(lambda: "upstream slow: connecting" in report.getvalue(), 30, "the start-up report")

        changed = anyio.Event()

        async def on_message(message: object) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        with anyio.fail_after(120):
            async with (
                Client(unix_client(d.socket), mode="legacy", message_handler=on_message) as legacy,
                Client(unix_client(d.socket)) as modern,
            ):
                early = await legacy.list_tools()
                assert "fast__echo" in _names(early) and "tool_search" not in _names(early)
                assert modern.protocol_version == "2026-07-28"
                early_modern = await modern.list_tools()
                assert "fast__echo" in _names(early_modern)
                assert early_modern.ttl_ms == 0  # not the 30 s hint: this list is still growing

                gate.touch()
                # The legacy client re-lists only when told to; it must end on the meta-tools.
                names = _names(early)
                while names != META:
                    await changed.wait()
                    changed = anyio.Event()
                    names = _names(await legacy.list_tools(cache_mode="refresh"))
                late_modern = await modern.list_tools(cache_mode="refresh")
                assert _names(late_modern) == META and late_modern.ttl_ms == 30_000
        st = d.status()
        assert st["index"]["ready"] and st["waiting_for"] == []
        reporter.join(60)
        assert not reporter.is_alive()
        printed = report.getvalue()
        assert "toolatlas: waiting for: upstream slow: connecting (" in printed, printed
        assert "toolatlas: serving" in printed and printed.endswith("toolatlas: ready, nothing left to wait for\n")
        r = d.tool("execute_tool", {"name": "slow__echo", "arguments": {"message": "late"}})
        assert not r.get("isError") and text(r) == "Echo: late"


@pytest.mark.timeout(900)
def test_a_fresh_state_dir_exports_from_spawn_serves_bm25_meanwhile_then_goes_hybrid(tmp_path: Path) -> None:
    """A first start, end to end, on one real export (on a busy machine the niced export is
    the suite's slowest step, so the whole path shares one):
    - the export starts at spawn, not after the first index: an upstream that stays
      "connecting" holds the first index back while the export is already under way;
    - once the index lands, BM25 search and calls serve while the export is still held;
    - then the export runs, an earlier format's folder is cleared, the model loads, the catalog
      is embedded and search turns hybrid without a restart."""
    export_gate, slow_gate = tmp_path / "export-may-start", tmp_path / "slow-may-start"
    # Not seeded: this daemon exports the model into its own state_dir, as on a first start.
    d = Daemon(tmp_path, stdio_testserver("fast") + gated_upstream("slow", slow_gate, connect_s=900),
               search_extra='embedder = "onnx"\n', seed_models=False)
    assert not (tmp_path / "state").exists()
    with d.start(ready=False, env={HOLD_EXPORT_ENV: str(export_gate)}):
        st = d.wait_for(lambda: (s := d.status())["index"]["model"]["phase"] == "exporting" and s, 60, "exporting")
        assert st["index"]["ready"] is False
        assert any(w.startswith("embedding model: exporting (") for w in st["waiting_for"]), st["waiting_for"]
        stale = tmp_path / "state" / EXPORT.parent.parent / "minilm-l6-v2-onnx-v1"
        stale.mkdir()  # an earlier export format, as an upgrade leaves it
        (stale / "model.onnx").write_bytes(b"x" * 1024)

        slow_gate.touch()  # the first index lands while the gate still holds the export
        st = d.wait_for(lambda: (s := d.status())["index"]["ready"] and s, 120, "the first index")
        idx = st["index"]
        assert idx["degraded"] == "embedding model loading"
        assert idx["model"]["phase"] == "exporting" and idx["dense_index"] is None
        assert any(w.startswith("embedding model: exporting (") for w in st["waiting_for"]), st["waiting_for"]
        answer = d.meta("tool_search", {"query": "echo the message back", "top_k": 3})
        assert {m["name"] for m in answer["matches"][:2]} == {"fast__echo", "slow__echo"}, answer
        assert answer["degraded"] == "embedding model loading"
        assert not (tmp_path / "state" / EXPORT).exists()
        r = d.tool("execute_tool", {"name": "fast__echo", "arguments": {"message": "before"}})
        assert not r.get("isError") and text(r) == "Echo: before"

        export_gate.touch()  # the real export runs now, then the model loads and the catalog is embedded
        # ready, then (below rank.HNSW_MIN, served by an exact scan meanwhile) the graph filled
        st = d.wait_for(lambda: (s := d.status())["index"]["model"]["phase"] == "ready"
                        and (s["index"]["dense_index"] or {}).get("live") == s["index"]["tools"] and s, 600, "hybrid")
        idx = st["index"]
        assert idx["ready"] and idx["degraded"] is None and st["waiting_for"] == []
        assert idx["tools"] > 0 and idx["dense_index"]["live"] == idx["tools"]
        assert idx["embeddings_computed"] == idx["tools"]
        assert (tmp_path / "state" / EXPORT).is_file()
        assert not stale.exists()
        answer = d.meta("tool_search", {"query": "echo the message back", "top_k": 3})
        assert {m["name"] for m in answer["matches"][:2]} == {"fast__echo", "slow__echo"}, answer
        assert answer["degraded"] is None


def _exporters(state: Path) -> list[int]:
    """Pids of live exporter subprocesses writing under `state`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"toolatlas.retrieval.export_onnx" in argv and any(str(state).encode() in a for a in argv):
            pids.append(int(proc.name))
    return pids


@pytest.mark.timeout(300)
def test_a_shutdown_before_the_first_index_kills_the_running_export(tmp_path: Path) -> None:
    slow_gate = tmp_path / "slow-may-start"
    d = Daemon(tmp_path, gated_upstream("slow", slow_gate), search_extra='embedder = "onnx"\n', seed_models=False)
    with d.start(ready=False):
        d.wait_for(lambda: _exporters(tmp_path / "state"), 60, "the exporter subprocess")
        assert d.status()["index"]["ready"] is False
        assert d.stop() == 0
    # The daemon has exited; the exporter it started must not outlive it.
    deadline = time.monotonic() + 30
    while _exporters(tmp_path / "state") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _exporters(tmp_path / "state") == []
    assert not (tmp_path / "state" / EXPORT).exists()


@pytest.mark.timeout(300)
def test_a_daemon_killed_while_exporting_takes_the_export_along_and_the_next_start_clears_its_folder(
    tmp_path: Path,
) -> None:
    """A SIGKILL (the OOM killer, a stop timeout) gives the daemon no shutdown: its exporter
    ran on as an orphan for minutes of CPU, and its `.export-*` folder stayed for good. The
    exporter now exits with its parent, and the next start clears what it left."""
    d = Daemon(tmp_path, stdio_testserver("alpha"), search_extra='embedder = "onnx"\n', seed_models=False)
    models = tmp_path / "state" / EXPORT.parent.parent
    with d.start(ready=False):
        d.wait_for(lambda: _exporters(tmp_path / "state") and list(models.glob(".export-*")), 60, "the exporter")
        assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while _exporters(tmp_path / "state") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _exporters(tmp_path / "state") == []
    assert list(models.glob(".export-*")), "the killed export's folder (what the next start must clear)"

    # The next start (its own export held: only what it clears first is looked at)
    with d.start(ready=False, env={HOLD_EXPORT_ENV: str(tmp_path / "never")}):
        d.wait_for(lambda: "embed.export_held" in d.log.read_text(), 60, "the next export held")
        assert list(models.glob(".export-*")) == [] and "embed.export_removed_dead" in d.log.read_text()
