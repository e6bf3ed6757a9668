"""Adaptive top-k and abstention, for a caller that did not ask for a number of results.

Both are pure functions of one search's figures, calibrated on ToolLens train only (a seeded
1,500-query validation split held out of the 16,893; bench/learning.py reports the test split):

- `cut`: keep the results scoring within GAP of the first (fused z-score units of
  rank.fused_scores), at least one, at most the caller's maximum. GAP = 3.0 keeps R@auto at
  0.330 with 3.6 tools on the validation split (R@5 0.372 with 5; gaps 1.0 / 2.0 / 4.0 give
  0.256 / 0.307 / 0.345 with 2.2 / 3.1 / 4.1 tools).
- `nothing_fits`: no tool is semantically close (best cosine below COS_FLOOR) and none covers
  half of the query's words (BM25 over its ceiling below COVER_FLOOR). COS_FLOOR abstains on
  at most 1 in 5,000 of ToolLens train's in-domain queries: 3 of the 16,893 have a best cosine
  under 0.16 (0.132, 0.134, 0.148; the next is 0.160), and the floor sits midway in that gap.
  An abstention that is wrong costs the caller a second search, so the floor is set for
  catalogs unlike ToolLens too: the earlier 0.21 (at most 0.5 % of train) abstained on 3.3 %
  of MCPToolBench++ and on 2 of the 20 labelled queries over the example servers (cosines
  0.157 and 0.159 on a 13-tool catalog); queries far from every tool there score 0.10-0.17.
"""

from __future__ import annotations

from collections.abc import Sequence

GAP = 3.0
COS_FLOOR = 0.154
COVER_FLOOR = 0.5


def cut(scores: Sequence[float], max_k: int) -> int:
    """How many of `scores` (best first) to return: those within GAP of the first."""
    if not scores:
        return 0
    top = scores[0]
    n = 1
    while n < min(len(scores), max_k) and scores[n] >= top - GAP:
        n += 1
    return n


def nothing_fits(best_cosine: float, best_cover: float) -> bool:
    """Whether no tool is close enough to the query to be worth showing."""
    return best_cosine < COS_FLOOR and best_cover < COVER_FLOOR


__all__ = ["COS_FLOOR", "COVER_FLOOR", "GAP", "cut", "nothing_fits"]
