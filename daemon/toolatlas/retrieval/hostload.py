"""How many cores the host's other processes keep busy: the query embedder's choice between a
lone query on two spinning threads and one thread (embed.py, issue 19).

The first probe read /proc/loadavg's runnable threads. Those include this process's own:
the spinning session's second thread is still runnable for a moment after each query, so on
a quiet host the next query often found "no idle core" and ran on one thread
(bench/contention.py, quiet 2-core host: p95 27.1 ms with that probe against 16.2 ms with
spinning always on; under a one-core hog 20.4 against 38.9 ms). This one subtracts what this
process used: the host's busy CPU time (/proc/stat) minus this process's CPU time (every
thread), over the wall time between two samples.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

SAMPLE_S = 0.25  # at most one sample per this many seconds; between them the last figure holds
# /proc/stat's cpu columns that count as busy: user nice system (idle iowait) irq softirq steal.
# Steal is time this VM wanted a core and the hypervisor gave it to someone else: contention too.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def host_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot, or None where /proc cannot tell."""
    try:
        with open("/proc/stat", "rb") as fh:
            cpu = fh.readline().split()
        if cpu[0] != b"cpu":
            return None
        return sum(int(cpu[1 + i]) for i in _BUSY_COLUMNS) / _TICKS_PER_S
    except (OSError, ValueError, IndexError):
        return None


class OtherLoad:
    """Cores other processes kept busy over the latest interval (>= SAMPLE_S, the first one
    starting at construction): (host busy time - this process's CPU time) / wall time."""

    def __init__(self, busy: Callable[[], float | None] = host_busy_s,
                 own: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic) -> None:
        self._busy, self._own, self._clock = busy, own, clock
        self._cores: float | None = None
        self._at = clock()
        self._last = busy(), own()

    def cores(self) -> float | None:
        """The latest figure (None: the host cannot tell), sampled anew once SAMPLE_S passed."""
        now = self._clock()
        if now - self._at < SAMPLE_S:
            return self._cores
        busy, own = self._busy(), self._own()
        last_busy, last_own = self._last
        if busy is None or last_busy is None:
            self._cores = None
        else:
            self._cores = max(0.0, (busy - last_busy) - (own - last_own)) / (now - self._at)
        self._at, self._last = now, (busy, own)
        return self._cores


__all__ = ["SAMPLE_S", "OtherLoad", "host_busy_s"]
