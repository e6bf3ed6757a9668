"""What one daemon of the test suite costs: exec'd (`python -m toolatlas serve`, as before stop 55)
against forked from the suite's fork server (tests/support/servers/forkserver.py), alternating.

    .venv/bin/python bench/suite_daemon.py [--rounds 8]

Each start is the harness's `Daemon` (tests/support/daemon.py) with one stdio test server, as
most end-to-end tests use it: start until the index is ready, one tool_search, then SIGTERM.
Reported per way: the daemon's own CPU seconds up to the stop (user + system, from /proc; its
stdio child not counted) and the wall seconds from spawn to the search's answer, medians. The
fork server's own start (once per pytest worker) is reported apart.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import Daemon, emit, median, proc_cpu_s, stdio_testserver

from tests.support import servers


def one(exec_: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        d = Daemon(Path(tmp), stdio_testserver("t")).start(exec_=exec_)
        try:
            assert d.search("add two numbers")[:1] == ["t__add_tool"]
            wall = time.monotonic() - started
            assert d.proc is not None
            cpu = proc_cpu_s(d.proc.pid)
        finally:
            code = d.stop()
        assert code == 0, (code, d.log.read_text()[-2000:])
        return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    os.environ[servers.FORKSERVER_ENV] = "1"  # as tests/conftest.py sets it for the suite
    started = time.monotonic()
    assert servers.forkserver_socket() is not None, "the fork server did not start"
    fork_server_start = time.monotonic() - started
    assert servers._forkserver is not None
    fork_server_cpu = proc_cpu_s(servers._forkserver[0].pid)
    got: dict[str, list[tuple[float, float]]] = {"exec": [], "fork": []}
    one(False)  # untimed: first-use costs (page cache, the export's link) on neither side
    for i in range(args.rounds):
        for way in (("exec", "fork") if i % 2 == 0 else ("fork", "exec")):
            got[way].append(one(way == "exec"))
    result = {
        "rounds": args.rounds,
        "load_avg": os.getloadavg(),
        "fork_server_start": {"wall_s": round(fork_server_start, 3), "cpu_s": round(fork_server_cpu, 3)},
        **{way: {"daemon_cpu_s": round(median([c for c, _ in rows]), 3),
                 "spawn_to_answer_s": round(median([w for _, w in rows]), 3)} for way, rows in got.items()},
    }
    result["cpu_ratio_fork_over_exec"] = round(result["fork"]["daemon_cpu_s"] / result["exec"]["daemon_cpu_s"], 3)
    emit(result, "suite_daemon")


if __name__ == "__main__":
    main()
