"""Pure unit tests: the upstream state table, `decide`, and the backoff function."""

from __future__ import annotations

import itertools

import pytest

from toolatlas.backoff import backoff_delay
from toolatlas.upstream.state import TRANSITIONS, Action, Event, InvalidTransition, UpstreamState, decide

S, E = UpstreamState, Event


def test_table_covers_the_lifecycle() -> None:
    assert TRANSITIONS[(S.CONNECTING, E.CONNECTED)] is S.READY
    assert TRANSITIONS[(S.CONNECTING, E.CONNECT_FAILED)] is S.DEGRADED
    assert TRANSITIONS[(S.READY, E.LOST)] is S.DEGRADED
    assert TRANSITIONS[(S.DEGRADED, E.RETRY)] is S.CONNECTING
    for state in (S.CONNECTING, S.READY, S.DEGRADED, S.DISABLED):
        assert TRANSITIONS[(state, E.CLOSE)] is S.CLOSED


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_every_pair_is_either_in_the_table_or_rejected(state: UpstreamState, event: Event) -> None:
    if (state, event) in TRANSITIONS:
        assert decide(state, event, attempt=0).state is TRANSITIONS[(state, event)]
    else:
        with pytest.raises(InvalidTransition, match=event.value):
            decide(state, event, attempt=0)


def test_closed_and_disabled_are_terminal_except_close() -> None:
    for event in E:
        with pytest.raises(InvalidTransition):
            decide(S.CLOSED, event, attempt=0)
    for event in (E.CONNECTED, E.LOST, E.RETRY, E.CONNECT_FAILED):
        with pytest.raises(InvalidTransition):
            decide(S.DISABLED, event, attempt=0)


def test_connected_publishes_tools() -> None:
    d = decide(S.CONNECTING, E.CONNECTED, attempt=3)
    assert d.actions == (Action.PUBLISH_TOOLS,)
    assert d.attempt == 3  # a flapping upstream keeps its backoff until it proves healthy


def test_connect_failure_counts_up_and_schedules_retry() -> None:
    d = decide(S.CONNECTING, E.CONNECT_FAILED, attempt=2)
    assert d.state is S.DEGRADED and d.attempt == 3
    assert Action.SCHEDULE_RETRY in d.actions and Action.WITHDRAW_TOOLS not in d.actions


def test_lost_withdraws_tools_and_resets_after_a_healthy_period() -> None:
    short = decide(S.READY, E.LOST, attempt=4, healthy_for=1.0, reset_after=60.0)
    assert short.actions == (Action.WITHDRAW_TOOLS, Action.CLOSE_SESSION, Action.SCHEDULE_RETRY)
    assert short.attempt == 5
    long = decide(S.READY, E.LOST, attempt=4, healthy_for=61.0, reset_after=60.0)
    assert long.attempt == 1


def test_close_withdraws_only_when_tools_were_published() -> None:
    assert Action.WITHDRAW_TOOLS in decide(S.READY, E.CLOSE, attempt=0).actions
    assert Action.WITHDRAW_TOOLS not in decide(S.DEGRADED, E.CLOSE, attempt=0).actions


def test_backoff_grows_exponentially_then_caps() -> None:
    mid = lambda: 0.5  # noqa: E731 - jitter term is zero at rng()=0.5
    delays = [backoff_delay(a, base=0.5, cap=30.0, jitter=0.2, rng=mid) for a in range(1, 10)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert delays[-1] == 30.0
    assert delays == sorted(delays)


def test_backoff_jitter_stays_within_bounds() -> None:
    for a in range(1, 12):
        lo = backoff_delay(a, base=1.0, cap=10.0, jitter=0.2, rng=lambda: 0.0)
        hi = backoff_delay(a, base=1.0, cap=10.0, jitter=0.2, rng=lambda: 0.999999)
        plain = min(10.0, 2.0 ** (a - 1))
        assert lo == pytest.approx(plain * 0.8)
        assert hi == pytest.approx(plain * 1.2, rel=1e-5)
    assert backoff_delay(10_000, cap=30.0) <= 36.0  # no overflow for huge attempt counts


def test_backoff_is_zeroable_and_zero_before_any_failure() -> None:
    assert backoff_delay(5, base=0.0) == 0.0
    assert backoff_delay(0) == 0.0
