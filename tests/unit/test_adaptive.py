"""Adaptive top-k and abstention (retrieval/adaptive.py): the pure rules."""

from __future__ import annotations

from toolatlas.retrieval import adaptive


def test_cut_keeps_what_is_within_the_gap_of_the_first() -> None:
    g = adaptive.GAP
    assert adaptive.cut([], 5) == 0
    assert adaptive.cut([9.0], 5) == 1
    assert adaptive.cut([9.0, 9.0 - g, 9.0 - g - 0.01, 1.0], 5) == 2
    assert adaptive.cut([5.0, 5.0, 5.0, 5.0, 5.0, 5.0], 4) == 4  # never more than asked
    assert adaptive.cut([50.0, 3.0, 2.9], 5) == 1  # one tool far ahead (feedback): just it


def test_nothing_fits_needs_both_signals_low() -> None:
    f, c = adaptive.COS_FLOOR, adaptive.COVER_FLOOR
    assert adaptive.nothing_fits(f - 0.01, c - 0.01)
    assert not adaptive.nothing_fits(f + 0.01, 0.0)  # close in meaning
    assert not adaptive.nothing_fits(0.0, c)  # names half the query's words
