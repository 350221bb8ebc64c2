"""Skipping redeliveries, with real pulsar message ids."""

from __future__ import annotations

import pulsar

from magnetar.instance.positions import RedeliveryFilter
from magnetar.positions import AppliedPositions, position


def mid(ledger: int, entry: int, batch: int = -1) -> pulsar.MessageId:
    return pulsar.MessageId(-1, ledger, entry, batch)


def test_redeliveries_are_skipped_per_topic() -> None:
    seen = RedeliveryFilter()
    assert [seen.is_redelivery("a", mid(1, e)) for e in (0, 1, 2)] == [False, False, False]
    assert seen.is_redelivery("a", mid(1, 1)) is True
    assert seen.is_redelivery("a", mid(1, 2)) is True
    assert seen.is_redelivery("b", mid(1, 1)) is False  # another partition, its own order
    assert seen.is_redelivery("a", mid(1, 3)) is False


def test_an_older_message_never_applied_is_not_a_redelivery() -> None:
    """A new Failover consumer may get fresh messages before older, unacknowledged ones."""
    seen = RedeliveryFilter()
    assert [seen.is_redelivery("t", mid(1, e)) for e in (5, 6, 2, 3)] == [False] * 4
    assert [seen.is_redelivery("t", mid(1, e)) for e in (2, 3, 5, 6)] == [True] * 4


def test_applied_positions_keep_a_window_above_a_floor() -> None:
    applied = AppliedPositions(window=3)
    assert [applied.add((1, e, -1)) for e in (4, 2, 9)] == [None, None, None]
    assert applied.add((1, 7, -1)) == (1, 2, -1)  # the lowest leaves the window: the floor
    assert applied.floor == (1, 2, -1)
    assert (1, 1, -1) in applied and (1, 2, -1) in applied and (1, 9, -1) in applied
    assert (1, 3, -1) not in applied and (1, 8, -1) not in applied


def test_a_retried_message_passes_once() -> None:
    seen = RedeliveryFilter()
    for entry in range(5):
        seen.is_redelivery("t", mid(2, entry))
    seen.retry(mid(2, 1))
    assert seen.is_redelivery("t", mid(2, 1)) is False
    assert seen.is_redelivery("t", mid(2, 1)) is True


def test_batch_index_orders_messages_inside_an_entry() -> None:
    seen = RedeliveryFilter()
    assert seen.is_redelivery("t", mid(3, 7, 0)) is False
    assert seen.is_redelivery("t", mid(3, 7, 1)) is False
    assert seen.is_redelivery("t", mid(3, 7, 0)) is True
    assert position(mid(3, 7, 1)) == (3, 7, 1)
