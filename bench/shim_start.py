"""`toolatlas shim` start to first byte relayed, against a running daemon.

    .venv/bin/python bench/shim_start.py [--runs 30]

Each run spawns the console script `toolatlas shim` with an initialize request already
waiting on its stdin and measures spawn -> first byte on its stdout (the daemon's answer
relayed). Also reports whether the shim imported numpy/torch/mcp (it must not).
Goal: median <= 150 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import Daemon, emit, stdio_testserver, summary

INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=30)
    a = p.parse_args()
    exe = str(Path(sys.executable).parent / "toolatlas")
    with tempfile.TemporaryDirectory() as tmp, Daemon(Path(tmp), stdio_testserver("s")) as d:
        samples = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            proc = subprocess.Popen([exe, "shim", "--socket", d.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert proc.stdin and proc.stdout
            proc.stdin.write(INIT.encode())
            proc.stdin.flush()
            first = os.read(proc.stdout.fileno(), 1)
            samples.append(time.perf_counter() - t0)
            assert first == b"{"
            proc.stdin.close()
            proc.wait(timeout=10)
            proc.stdout.close()
        probe = subprocess.run(
            [sys.executable, "-c", "import sys, toolatlas.cli, toolatlas.surface.shim; print(' '.join(sys.modules))"],
            capture_output=True, text=True, check=True,
        )
        loaded = set(probe.stdout.split())
        heavy = sorted(m for m in ("numpy", "torch", "mcp", "onnxruntime", "msgspec", "anyio") if m in loaded)
    emit({
        "bench": "shim_start",
        "runs": a.runs,
        "spawn_to_first_byte": summary(samples),
        "heavy_modules_imported": heavy,
        "goal": "median <= 150 ms",
    }, "shim_start")


if __name__ == "__main__":
    main()
