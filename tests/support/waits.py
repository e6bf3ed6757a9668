"""Waiting in async tests: poll a cheap predicate with a deadline (never a fixed sleep)."""

from __future__ import annotations

from collections.abc import Callable

import anyio


async def until(predicate: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    """Return once `predicate()` is true; TimeoutError naming `what` after `timeout` s."""
    try:
        with anyio.fail_after(timeout):
            while not predicate():
                await anyio.sleep(0.02)
    except TimeoutError:
        raise TimeoutError(f"no {what} within {timeout} s") from None
