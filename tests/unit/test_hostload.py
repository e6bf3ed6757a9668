"""hostload.OtherLoad: the cores other processes keep busy, this process's own CPU left out."""

from __future__ import annotations

from toolatlas.retrieval.hostload import SAMPLE_S, OtherLoad, host_busy_s


class Clocks:
    """Host busy seconds, this process's CPU seconds and wall time, advanced by the test."""

    def __init__(self) -> None:
        self.busy: float | None = 100.0
        self.own = 10.0
        self.now = 1000.0

    def advance(self, wall: float, others: float, own: float) -> None:
        """`wall` seconds pass while other processes use `others` cores and this one `own`."""
        self.now += wall
        self.own += own * wall
        if self.busy is not None:
            self.busy += (others + own) * wall


def _load(c: Clocks) -> OtherLoad:
    return OtherLoad(busy=lambda: c.busy, own=lambda: c.own, clock=lambda: c.now)


def test_this_process_own_work_is_not_counted() -> None:
    c = Clocks()
    load = _load(c)
    c.advance(1.0, others=0.0, own=2.0)  # both cores busy with this process's own threads
    assert load.cores() == 0.0


def test_another_process_on_one_core_counts_as_one() -> None:
    c = Clocks()
    load = _load(c)
    c.advance(2.0, others=1.0, own=0.7)
    assert abs((load.cores() or 0) - 1.0) < 1e-9


def test_the_figure_holds_between_samples_then_follows_the_host() -> None:
    c = Clocks()
    load = _load(c)
    c.advance(1.0, others=1.0, own=0.0)
    assert abs((load.cores() or 0) - 1.0) < 1e-9
    c.advance(SAMPLE_S / 2, others=0.0, own=0.0)
    assert abs((load.cores() or 0) - 1.0) < 1e-9  # too soon for a new sample
    c.advance(1.0, others=0.0, own=1.0)
    assert (load.cores() or 0) < 0.2  # the hog went away: the interval since the last sample says so


def test_no_figure_where_the_host_cannot_tell() -> None:
    c = Clocks()
    c.busy = None
    load = _load(c)
    c.advance(1.0, others=1.0, own=0.0)
    assert load.cores() is None


def test_the_real_host_gives_a_figure() -> None:
    busy = host_busy_s()
    assert busy is not None and busy > 0  # Linux: /proc/stat is readable here
