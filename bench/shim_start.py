"""`toolatlas shim` start to first byte relayed, against a running daemon.

    .venv/bin/python bench/shim_start.py [--runs 30]

Each run spawns the console script `toolatlas shim` with an initialize request already
waiting on its stdin and measures spawn -> first byte on its stdout (the daemon's answer
relayed); the same for `toolatlas shim --config PATH` (it reads the config's socket), and,
as the floor no shim can beat on this machine, the same interpreter writing one byte
(`python -c`, site imports included), and the daemon's own answer time (an initialize
sent straight to its socket). Also: the shim's imports (`python -X importtime`, the
fastest of --runs, so the figure is the machine's and not its load's), the wall time of
`toolatlas shim --help`, and whether the shim imported numpy/torch/mcp (it must not).
The package is byte-compiled first, as `pip install` leaves it (with PYTHONDONTWRITEBYTECODE
set, every start would compile the shim's modules again: ~40 ms more).
Goal: median <= 150 ms. On a loaded machine compare the shim with the floor.
"""

from __future__ import annotations

import argparse
import compileall
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
HEAVY = ("numpy", "torch", "mcp", "onnxruntime", "msgspec", "anyio", "pydantic")


def first_byte(argv: list[str]) -> float:
    """Seconds from spawn to the first byte on stdout, an initialize waiting on stdin."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin and proc.stdout
    proc.stdin.write(INIT.encode())
    proc.stdin.flush()
    first = os.read(proc.stdout.fileno(), 1)
    took = time.perf_counter() - t0
    assert first == b"{", first
    proc.stdin.close()
    proc.wait(timeout=10)
    proc.stdout.close()
    return took


def daemon_answer(path: str) -> float:
    """Seconds from connecting to the daemon's socket, an initialize sent, to its first byte
    back: the daemon's share of a shim's first byte."""
    import socket

    t0 = time.perf_counter()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.sendall(INIT.encode())
        first = sock.recv(1)
    took = time.perf_counter() - t0
    assert first == b"{", first
    return took


def import_ms(runs: int) -> dict[str, float]:
    """The shim's own imports: the sum of self times (ms) over the modules it loads beyond
    a bare interpreter, the fastest of `runs` runs."""
    code = "import toolatlas.cli, toolatlas.surface.shim"
    best: dict[str, float] = {}
    for _ in range(runs):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                             check=True).stderr
        base = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True,
                              check=True).stderr
        at_start = {line.rsplit("|", 1)[1].strip() for line in base.splitlines() if "|" in line}
        for line in err.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, _cum, name = line.split(":", 1)[1].split("|")
            if name.strip() not in at_start:
                best[name.strip()] = min(best.get(name.strip(), 1e12), int(self_us) / 1000)
    top = sorted(best.items(), key=lambda kv: -kv[1])[:8]
    return {"total_ms": round(sum(best.values()), 1), "modules": len(best),
            "largest_ms": {k: round(v, 2) for k, v in top}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=30)
    a = p.parse_args()
    exe = str(Path(sys.executable).parent / "toolatlas")
    import toolatlas

    compiled = compileall.compile_dir(str(Path(toolatlas.__file__).parent), quiet=1)
    load = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp, Daemon(Path(tmp), stdio_testserver("s")) as d:
        shim, shim_config, floor, answer = [], [], [], []
        for _ in range(a.runs):  # interleaved, so load swings hit all of them alike
            shim.append(first_byte([exe, "shim", "--socket", d.socket]))
            shim_config.append(first_byte([exe, "shim", "--config", str(d.config)]))
            floor.append(first_byte([sys.executable, "-c", "import os; os.write(1, b'{'); os.read(0, 1)"]))
            answer.append(daemon_answer(d.socket))
        helps = []
        for _ in range(min(a.runs, 10)):
            t0 = time.perf_counter()
            subprocess.run([exe, "shim", "--help"], capture_output=True, check=True)
            helps.append(time.perf_counter() - t0)
        probe = subprocess.run(
            [sys.executable, "-c", "import sys, toolatlas.cli, toolatlas.surface.shim, toolatlas.surface.autostart;"
             " print(' '.join(sys.modules))"], capture_output=True, text=True, check=True,
        )
        loaded = set(probe.stdout.split())
        heavy = sorted(m for m in HEAVY if m in loaded)
        imports = import_ms(min(a.runs, 10))
    emit({
        "bench": "shim_start",
        "runs": a.runs,
        "loadavg_start": load,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "spawn_to_first_byte": summary(shim),
        "spawn_to_first_byte_config": summary(shim_config),
        "interpreter_floor": summary(floor),
        "daemon_answer": summary(answer),
        "shim_help_wall": summary(helps),
        "shim_imports": imports,
        "heavy_modules_imported": heavy,
        "byte_compiled": bool(compiled),
        "goal": "median <= 150 ms",
    }, "shim_start")


if __name__ == "__main__":
    main()
