"""CPU time per execute_tool: what each process spends, not how long the call waits.

    .venv/bin/python bench/relay_cpu.py [--calls 2000]

Wall-clock overhead on a shared 2-core machine is mostly waiting for a core; CPU time per
call says what the gateway itself costs. A daemon (BM25, the project's stdio test server)
serves `execute_tool` to an SDK client on its Unix socket; the same client also calls the
test server directly over a warm stdio session. For each path: wall ms per call, this
client's CPU ms per call, the upstream child's, and for the gateway the daemon's (user and
system, per thread) and its context switches per call. Read it beside `wire_floor.py` (the
bare cost of one more process hop here). Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from _common import Daemon, cpu_times_s, descendants, emit, stdio_testserver
from tests.support.servers import testserver_args
from toolatlas.surface.unix import unix_client

def proc_cpu(pid: int) -> tuple[float, float]:
    return cpu_times_s(Path(f"/proc/{pid}/stat").read_text())  # utime, stime


def thread_cpu(pid: int) -> dict[str, float]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        out[f"{task.name}:{stat[stat.index('(') + 1:stat.rindex(')')]}"] = sum(cpu_times_s(stat))
    return out


def switches(pid: int) -> tuple[int, int]:
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    return int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_call(before: float, after: float, n: int) -> float:
    return round((after - before) / n * 1000, 3)


async def run(sock: str, daemon_pid: int, n: int) -> dict[str, object]:
    out: dict[str, object] = {}
    async with Client(StdioServerParameters(command=sys.executable, args=testserver_args())) as direct:
        for _ in range(50):
            await direct.call_tool("echo", {"message": "hi"})
        gateway_side = set(descendants(daemon_pid)) | {daemon_pid}
        children = [p for p in descendants(os.getpid()) if p not in gateway_side]
        c0, u0, t0 = own_cpu(), sum(sum(proc_cpu(p)) for p in children), time.perf_counter()
        for _ in range(n):
            await direct.call_tool("echo", {"message": "hi"})
        out["direct"] = {"wall_ms": per_call(t0, time.perf_counter(), n), "client_cpu_ms": per_call(c0, own_cpu(), n),
                         "upstream_cpu_ms": per_call(u0, sum(sum(proc_cpu(p)) for p in children), n)}
    async with Client(unix_client(sock)) as gw:
        via = {"name": "bench__echo", "arguments": {"message": "hi"}}
        for _ in range(50):
            await gw.call_tool("execute_tool", via)
        upstream = descendants(daemon_pid)
        c0, u0, t0 = own_cpu(), sum(sum(proc_cpu(p)) for p in upstream), time.perf_counter()
        (du0, ds0), x0, th0 = proc_cpu(daemon_pid), switches(daemon_pid), thread_cpu(daemon_pid)
        for _ in range(n):
            await gw.call_tool("execute_tool", via)
        wall = per_call(t0, time.perf_counter(), n)
        (du1, ds1), x1, th1 = proc_cpu(daemon_pid), switches(daemon_pid), thread_cpu(daemon_pid)
        out["socket"] = {
            "wall_ms": wall, "client_cpu_ms": per_call(c0, own_cpu(), n),
            "upstream_cpu_ms": per_call(u0, sum(sum(proc_cpu(p)) for p in upstream), n),
            "daemon_user_ms": per_call(du0, du1, n), "daemon_sys_ms": per_call(ds0, ds1, n),
            "daemon_threads_ms": {k: per_call(th0.get(k, 0.0), v, n) for k, v in th1.items() if v > th0.get(k, 0.0)},
            "daemon_switches_per_call": {"voluntary": round((x1[0] - x0[0]) / n, 2),
                                         "involuntary": round((x1[1] - x0[1]) / n, 2)},
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, Daemon(Path(tmp), stdio_testserver("bench")) as d:
        assert d.proc is not None
        result = anyio.run(run, d.socket, d.proc.pid, a.calls)
    emit({"bench": "relay_cpu", "calls": a.calls, "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
          "clock_ticks_per_s": os.sysconf("SC_CLK_TCK"), **result}, "relay_cpu")


if __name__ == "__main__":
    main()
