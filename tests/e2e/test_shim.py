"""The shim stays light and relays faithfully."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import Daemon, stdio_testserver


def test_shim_imports_nothing_heavy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, toolatlas.cli, toolatlas.surface.shim; print(' '.join(sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert not {"numpy", "torch", "mcp", "onnxruntime", "sentence_transformers", "anyio"} & set(out)


def test_shim_without_a_daemon_fails_with_a_clear_message(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "toolatlas", "shim", "--socket", str(tmp_path / "none.sock")],
        input=b"", capture_output=True, timeout=30,
    )
    assert r.returncode == 1
    assert b"cannot reach the toolatlas daemon" in r.stderr and b"none.sock" in r.stderr


def test_shim_relays_requests_and_replies_byte_for_byte(tmp_path: Path) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    payload = "".join(json.dumps(m) + "\n" for m in lines).encode()
    with Daemon(tmp_path, stdio_testserver("s")) as d:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolatlas", "shim", "--socket", d.socket],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        assert proc.stdin and proc.stdout
        proc.stdin.write(payload)
        proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline()) for _ in range(2)]
        proc.stdin.close()  # the client goes away: the shim ends by itself
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()
    assert [m["id"] for m in replies] == [1, 2]
    assert sorted(t["name"] for t in replies[1]["result"]["tools"]) == ["catalog_status", "execute_tool", "tool_search"]
