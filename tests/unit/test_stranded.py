"""When an instance on an ordered subscription asks for what a take-over left unsent: only
after it received something, once it has held nothing for the quiet time, then after twice
as long each time nothing comes; and what came because it asked. Only instances that
acknowledge every input themselves ask."""

from __future__ import annotations

import pytest

from magnetar.instance import FunctionConfig, InstanceOptions, stranded
from magnetar.instance.stranded import StrandedCheck, stranded_check


class Clock:
    """The module's ``time``, seconds: its wall clock is the monotonic one + 1e9."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + 1e9


class Message:
    def __init__(self, published_s: float) -> None:
        self._published_ms = int(published_s * 1000)

    def publish_timestamp(self) -> int:
        return self._published_ms


def published(clock: Clock, *ages_s: float) -> list[tuple[None, Message]]:
    """Messages as an instance takes them, published these many seconds ago."""
    return [(None, Message(clock.time() - age)) for age in ages_s]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(stranded, "time", clock)
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
    check.received(published(clock, 0))
    assert asks_at(check, clock, 80) == [5, 15, 35, 75]


def test_holding_postpones_and_a_message_starts_over(clock: Clock) -> None:
    check = StrandedCheck(5)
    check.received(published(clock, 0))
    assert asks_at(check, clock, 16) == [5, 15]
    clock.now += 3
    check.holding()  # processing: its acknowledgements go out before any ask
    assert asks_at(check, clock, 19) == []
    check.received(published(clock, 0))
    assert asks_at(check, clock, 6) == [5]


def test_it_reports_once_what_came_because_it_asked(clock: Clock) -> None:
    check = StrandedCheck(5)
    check.received(published(clock, 1, 0))
    assert asks_at(check, clock, 5) == [5]
    # two published before the last taken before the ask (left unsent), one since; then
    # more of them, taken next
    check.received(published(clock, 9, 8, 1))
    check.received(published(clock, 7))
    assert check.left_unsent() == 0  # more may come
    clock.now += 1
    assert check.left_unsent() == 3
    assert check.left_unsent() == 0
    check.received(published(clock, 0))
    check.received(published(clock, 9))  # counted only right after an ask
    clock.now += 1
    assert check.left_unsent() == 0


@pytest.mark.parametrize(
    ("settings", "asks"),
    [
        ({"retain_ordering": True}, True),
        ({"processing_guarantees": "EFFECTIVELY_ONCE"}, True),
        ({"retain_ordering": True, "processing_guarantees": "ATMOST_ONCE"}, True),
        ({}, False),  # Shared: no take-over
        ({"retain_ordering": True, "processing_guarantees": "MANUAL"}, False),
        ({"retain_ordering": True, "auto_ack": False}, False),
        ({"retain_ordering": True, "window_config": {"windowLengthCount": 3}}, False),
    ],
)
def test_only_instances_that_acknowledge_every_input_themselves_ask(
    settings: dict[str, object], asks: bool
) -> None:
    """What a function leaves unacknowledged, or a window holds, would come again."""
    config = FunctionConfig(name="f", py="f.py", inputs=["in"], **settings)
    assert (stranded_check(config, InstanceOptions()) is not None) is asks
    assert stranded_check(config, InstanceOptions(stranded_check_s=None)) is None
