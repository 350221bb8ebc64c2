"""Sequence ids of EFFECTIVELY_ONCE outputs, with real pulsar message ids: they grow with the
input's position, and an input handled after later ones of its partition still gets an id the
broker keeps (``tests/integration/test_output_sequence.py`` shows the broker keeping it)."""

from __future__ import annotations

import logging

import pulsar
import pytest

from magnetar.instance.output_sequence import OutputSequence, sequence_id
from magnetar.positions import position

PARTITION = "persistent://public/default/in-partition-1"


def mid(ledger: int, entry: int, batch: int = -1) -> pulsar.MessageId:
    return pulsar.MessageId(1, ledger, entry, batch)


def test_sequence_ids_grow_with_the_position() -> None:
    ids = [mid(1, 0), mid(1, 0, 0), mid(1, 0, 1), mid(1, 1), mid(2, 0)]
    ordered = sorted(ids, key=position)
    assert [sequence_id(m) for m in ordered] == sorted(sequence_id(m) for m in ids)
    assert len({sequence_id(m) for m in ids}) == len(ids)


def test_inputs_in_order_get_their_own_ids() -> None:
    sequence = OutputSequence(remembered=100)
    sequence.opened(PARTITION, -1)
    ids = [mid(46, entry) for entry in range(5)]
    assert [sequence.next_id(PARTITION, m) for m in ids] == [sequence_id(m) for m in ids]


def test_an_input_after_later_ones_gets_the_id_after_the_highest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A take-over handed 521 and 522 before 518-520: each of those gets an id above 522's,
    which the broker keeps; 523 then gets its own, which is above them all."""
    sequence = OutputSequence(remembered=100)
    sequence.opened(PARTITION, sequence_id(mid(46, 517)))  # the killed instance's last
    early = [sequence.next_id(PARTITION, mid(46, entry)) for entry in (521, 522)]
    with caplog.at_level(logging.WARNING):
        late = [sequence.next_id(PARTITION, mid(46, entry)) for entry in (518, 519, 520)]
    after = sequence.next_id(PARTITION, mid(46, 523))

    assert early == [sequence_id(mid(46, 521)), sequence_id(mid(46, 522))]
    assert late == [early[-1] + 1, early[-1] + 2, early[-1] + 3]
    assert after == sequence_id(mid(46, 523)) > late[-1]
    assert "message (46,518,1,-1) of " + PARTITION + " came after later ones" in caplog.text
    assert caplog.text.count("came after later ones") == 1  # the first of them
    assert "(1 so far for this partition)" in caplog.text


def test_an_input_at_or_below_what_the_name_held_keeps_its_id() -> None:
    """Handled by the instance before this one: the broker drops its output again."""
    sequence = OutputSequence(remembered=100)
    sequence.opened(PARTITION, sequence_id(mid(46, 600)))
    sequence.next_id(PARTITION, mid(46, 601))
    assert sequence.next_id(PARTITION, mid(46, 590)) == sequence_id(mid(46, 590))


def test_an_input_sent_again_gets_the_id_it_had() -> None:
    """After a failed send the input comes again: the same id, so if the first send was
    stored after all the broker drops this one."""
    sequence = OutputSequence(remembered=100)
    sequence.opened(PARTITION, sequence_id(mid(46, 517)))
    sequence.next_id(PARTITION, mid(46, 521))
    moved = sequence.next_id(PARTITION, mid(46, 518))
    sequence.next_id(PARTITION, mid(46, 522))
    assert sequence.next_id(PARTITION, mid(46, 518)) == moved
    assert sequence.next_id(PARTITION, mid(46, 521)) == sequence_id(mid(46, 521))


def test_a_name_used_by_another_instance_meanwhile_starts_a_new_series() -> None:
    """This process let the name go (idle) and another instance sent past 700 under it."""
    sequence = OutputSequence(remembered=100)
    sequence.opened(PARTITION, -1)
    sequence.next_id(PARTITION, mid(46, 10))
    sequence.opened(PARTITION, sequence_id(mid(46, 700)))
    assert sequence.next_id(PARTITION, mid(46, 650)) == sequence_id(mid(46, 650))
    assert sequence.next_id(PARTITION, mid(46, 701)) == sequence_id(mid(46, 701))


def test_batches_leave_fewer_ids_to_spare(caplog: pytest.LogCaptureFixture) -> None:
    """The ids to spare are those of the highest id's entry: after batch index 4093 one is
    left, and past it an output can only keep its own id, which the broker drops."""
    sequence = OutputSequence(remembered=100)
    sequence.opened(PARTITION, -1)
    highest = sequence.next_id(PARTITION, mid(46, 9, 4093))
    assert sequence.next_id(PARTITION, mid(46, 3)) == highest + 1
    with caplog.at_level(logging.ERROR):
        assert sequence.next_id(PARTITION, mid(46, 4)) == sequence_id(mid(46, 4))
    assert "than one entry has ids to spare (4,095): the broker's deduplication will drop" in (
        caplog.text
    )


def test_only_the_most_recent_ids_are_remembered() -> None:
    sequence = OutputSequence(remembered=2)
    sequence.opened(PARTITION, -1)
    sequence.next_id(PARTITION, mid(46, 5))
    moved = [sequence.next_id(PARTITION, mid(46, entry)) for entry in (1, 2, 3)]
    assert sequence.next_id(PARTITION, mid(46, 3)) == moved[2]
    assert sequence.next_id(PARTITION, mid(46, 1)) == moved[2] + 1  # forgotten: a new id
