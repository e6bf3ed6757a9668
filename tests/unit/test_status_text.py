"""Words of catalog_status and search notes that a model reads and acts on."""

from __future__ import annotations

from toolatlas.gateway.status import next_attempt


def test_a_retry_under_a_second_away_is_not_said_as_in_0_s() -> None:
    """A note read "next attempt in 0 s" for a retry 0.3 s away: to a model, "now, and it is
    failing". Under a second is said so; whole seconds as before."""
    assert next_attempt(0.3) == "in under a second"
    assert next_attempt(0.0) == "in under a second"
    assert next_attempt(1.4) == "in 1 s"
    assert next_attempt(29.6) == "in 30 s"
