"""Input checks of the socket surface (the line splitter: tests/unit/test_jsonlines.py)."""

from __future__ import annotations

from toolatlas.meta_tools import clamp_top_k
from toolatlas.errors import BadInput

import pytest


@pytest.mark.parametrize(("given", "want"), [(None, 5), (0, 1), (-3, 1), (7, 7), (20, 20), (99, 20), (3.0, 3)])
def test_top_k_is_clamped(given: object, want: int) -> None:
    assert clamp_top_k(given) == want


@pytest.mark.hostile
@pytest.mark.parametrize("bad", ["5", 2.5, True, [1], float("inf"), float("-inf"), float("nan")])
def test_top_k_rejects_non_integers(bad: object) -> None:
    with pytest.raises(BadInput, match="top_k must be an integer"):
        clamp_top_k(bad)
