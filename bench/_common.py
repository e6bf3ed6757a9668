"""Shared helpers for the bench scripts: statistics, and the test harness's daemon runner."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
sys.path.insert(0, str(REPO / "tests"))

from daemon_harness import Daemon, NetworkServer, descendants, stdio_testserver  # noqa: E402


def summary(samples_s: list[float]) -> dict[str, Any]:
    """Median, p95, mean and min of samples given in seconds, reported in milliseconds."""
    ms = sorted(x * 1000 for x in samples_s)
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 3),
        "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "min_ms": round(ms[0], 3),
    }


def proc_mem_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of process `pid` in MB, from /proc."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def emit(result: dict[str, Any], name: str) -> None:
    """Print the JSON result and keep a copy in bench/out/NAME.json."""
    OUT.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    (OUT / f"{name}.json").write_text(text + "\n")
    print(text)


__all__ = ["Daemon", "NetworkServer", "OUT", "REPO", "descendants", "emit", "proc_mem_mb", "stdio_testserver", "summary"]
