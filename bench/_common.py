"""Shared helpers for the bench scripts: statistics, and the test harness's daemon runner.

Every percentile (median included) a bench script reports is the nearest-rank one of
`toolatlas.evaluation.metrics.percentile`, through `pct_ms` / `median` below, so figures from
different scripts (and `toolatlas eval`) mean the same thing."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
sys.path.insert(0, str(REPO))  # the test support package: tests.support

from tests.support.daemon import Daemon, stdio_testserver  # noqa: E402
from tests.support.processes import descendants  # noqa: E402
from tests.support.servers import start_server  # noqa: E402

from toolatlas.evaluation.metrics import percentile  # noqa: E402


def median(values: Sequence[float]) -> float:
    """The nearest-rank 50th percentile (the lower middle value of an even count)."""
    return percentile(values, 50)


def pct_ms(samples_s: Sequence[float], q: float, digits: int = 3) -> float:
    """Nearest-rank percentile `q` (0..100) of samples in seconds, in milliseconds."""
    return round(percentile(samples_s, q) * 1000, digits)


def summary(samples_s: list[float]) -> dict[str, Any]:
    """Median, p95, mean and min of samples given in seconds, reported in milliseconds."""
    ms = [x * 1000 for x in samples_s]
    return {
        "n": len(ms),
        "median_ms": pct_ms(samples_s, 50),
        "p95_ms": pct_ms(samples_s, 95),
        "mean_ms": round(statistics.fmean(ms), 3),
        "min_ms": round(min(ms), 3),
    }


def proc_mem_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of process `pid` in MB, from /proc."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def cpu_times_s(stat: str) -> tuple[float, float]:
    """(user, system) CPU seconds from the text of a /proc/PID[/task/TID]/stat file."""
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    hz = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / hz, int(fields[12]) / hz


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process `pid` has used, from /proc."""
    return sum(cpu_times_s(Path(f"/proc/{pid}/stat").read_text()))


def wait_settled(status: Callable[[], dict[str, Any] | None], timeout: float) -> tuple[bool, dict[str, Any]]:
    """Wait until the daemon's background work after a catalog change has finished, so
    what follows times the steady state: the embedding model in and every tool embedded
    (`index.degraded` None, or "bm25-only" when the model failed), the Rift analysis (or its
    refusal), the token accounting and the index snapshot write, all for the current index
    version (Rift's report names its index since stop 39; before, a report of an older index
    passed while the next analysis was due or running).
    Returns (settled, the last catalog_status seen)."""
    deadline = time.monotonic() + timeout
    st: dict[str, Any] = {}
    while True:
        st = status() or st
        idx = st.get("index") or {}
        rift = st.get("rift") or {}
        done = (
            bool(idx)
            and idx.get("degraded") in (None, "bm25-only")
            # the analysis of this very index (a report of an older one means Rift is due or
            # running: its n x n matrix would be in the figures), or why there is none
            and ((rift.get("available") and rift.get("index_version") == idx.get("version"))
                 or rift.get("reason") not in (None, "not run yet"))
            and (st.get("tokens") or {}).get("index_version") == idx.get("version")
            and idx.get("persisted_version") == idx.get("version")
        )
        if done or time.monotonic() >= deadline:
            return bool(done), st
        time.sleep(0.25)


def memprobe_report(d: Any, out: Path, timeout: float = 300.0) -> dict[str, Any]:
    """Ask the memory probe (bench/memprobe, on daemon `d`'s PYTHONPATH, writing to `out`) for
    its report: SIGUSR2, then wait up to `timeout` s for the file."""
    out.unlink(missing_ok=True)
    os.kill(d.proc.pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.1)
    return json.loads(out.read_text()) if out.exists() else {"error": f"no probe report within {timeout} s"}


def caller_pythonpath() -> list[str]:
    """This process's PYTHONPATH entries, resolved (a relative `daemon` works from any cwd),
    empty ones dropped: what a script puts on a daemon's PYTHONPATH ahead of its own entries,
    so `PYTHONPATH=/other/tree/daemon` runs that tree's code."""
    return [str(Path(x).resolve()) for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]


def emit(result: dict[str, Any], name: str) -> None:
    """Print the JSON result and keep a copy in bench/out/NAME.json."""
    OUT.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    (OUT / f"{name}.json").write_text(text + "\n")
    print(text)


__all__ = ["Daemon", "OUT", "REPO", "caller_pythonpath", "cpu_times_s", "descendants", "emit", "median", "memprobe_report",
           "pct_ms", "proc_cpu_s", "proc_mem_mb", "start_server", "stdio_testserver", "summary", "wait_settled"]


async def interleaved(paths: dict[str, tuple[Any, str, dict[str, Any]]], n: int, warmup: int = 10) -> dict[str, list[float]]:
    """Seconds per call on each path (an MCP client, a tool, its arguments): `warmup` rounds
    untimed, then `n` rounds of one call on every path in a shuffled order (seeded), so a
    phase of the machine falls on every path alike. A call that returns isError fails."""
    for _ in range(warmup):
        for client, name, args in paths.values():
            await client.call_tool(name, args)
    order, rng = list(paths), random.Random(1)
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(n):
        rng.shuffle(order)
        for k in order:
            client, name, args = paths[k]
            t0 = time.perf_counter()
            res = await client.call_tool(name, args)
            times[k].append(time.perf_counter() - t0)
            assert not res.is_error, (k, res)
    return times
