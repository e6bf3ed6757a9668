"""Reconnect delays: capped exponential backoff with jitter, as a pure function.

Pure so that the state machine and the tests can reason about it; zeroable (``base=0``) so
supervision tests reconnect at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    attempt: int,
    *,
    base: float = 0.5,
    cap: float = 30.0,
    jitter: float = 0.2,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before reconnect attempt number ``attempt`` (1 = the first retry).

    ``base * 2**(attempt-1)`` capped at ``cap``, then spread by +-``jitter`` (a fraction) so a
    fleet of gateways does not reconnect in lock step; never negative, never above
    ``cap * (1 + jitter)``. ``attempt <= 0`` means "no failure yet" and gives 0.
    """
    if attempt <= 0 or base <= 0:
        return 0.0
    # min() before the power would overflow for huge attempt counts.
    exp = min(attempt - 1, 64)
    delay = min(cap, base * (2.0**exp))
    spread = delay * jitter * (2.0 * rng() - 1.0)
    return max(0.0, delay + spread)
