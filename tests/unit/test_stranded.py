"""When an instance on an ordered subscription asks for what a take-over left unsent: only
after it received something, once it has held nothing for the quiet time, then after twice
as long each time nothing comes."""

from __future__ import annotations

import pytest

from magnetar.instance import stranded
from magnetar.instance.stranded import StrandedCheck


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(stranded.time, "monotonic", clock)
    return clock


def asks_at(check: StrandedCheck, clock: Clock, until: float) -> list[float]:
    """The times (from now, each second) at which the check says to ask."""
    start, asks = clock.now, []
    while clock.now - start < until:
        clock.now += 1
        if check.due():
            asks.append(clock.now - start)
    return asks


def test_an_instance_that_never_received_never_asks(clock: Clock) -> None:
    check = StrandedCheck(5)
    check.holding()
    assert asks_at(check, clock, 100) == []


def test_it_asks_after_the_quiet_time_then_after_twice_as_long(clock: Clock) -> None:
    check = StrandedCheck(5)
    check.received()
    assert asks_at(check, clock, 80) == [5, 15, 35, 75]


def test_holding_postpones_and_a_message_starts_over(clock: Clock) -> None:
    check = StrandedCheck(5)
    check.received()
    assert asks_at(check, clock, 16) == [5, 15]
    clock.now += 3
    check.holding()  # processing: its acknowledgements go out before any ask
    assert asks_at(check, clock, 19) == []
    check.received()
    assert asks_at(check, clock, 6) == [5]
