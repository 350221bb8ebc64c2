"""The sequence ids of EFFECTIVELY_ONCE outputs, one series per input partition.

The broker stores an output only if its sequence id is above every id stored before under its
producer's name (one name per input partition, see ``partition_outputs``). An output's id
grows with its input's position (``sequence_id``), so the output of a replayed input is
dropped. That holds only while each partition's inputs are handled in order, and a Failover
take-over can break the order: before the delayed rewind that sends the new active consumer
what the old one left unacknowledged, Apache Pulsar may already hand it later messages (its
dispatcher reads for the new consumer when a send to the old one completes, and so does its
stuck-subscription check), as pulsar-lite does (which does not deduplicate). The first of
the older inputs would get an id below one already stored, and the broker would drop an
output that was never stored (a kill -9 test lost 3 of 4,000).

So an input handled here for the first time, whose id is at or below the highest this process
has given under the name but above what the name held when this process took it (everything
up to that was handled before), gets the id after the highest instead: the broker keeps it,
and a later replay of the input, with its own lower id, is dropped. An input sent before by
this process (again, after a failed send) gets the id it had. The ids to spare are those of
the highest one's entry, 4,095 less its batch index; past them the output would be dropped,
and that is logged as an error. Not covered: an instance that was handed the later inputs
and loses the partition before the earlier ones come; their next owner cannot tell them from
replays (``docs/apache-pulsar.md``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from magnetar.positions import Position, position

__all__ = ["OutputSequence", "sequence_id"]

log = logging.getLogger(__name__)

_SLOT_BITS = 12
"""Low bits of an id: the input's batch index + 1 (0 for a message sent alone)."""
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_LOG_EVERY = 1000


def sequence_id(message_id: Any) -> int:
    """A producer sequence id that grows with the input's position, so a broker with
    deduplication drops the output of a replayed input."""
    return _of_position(position(message_id))


def _of_position(current: Position) -> int:
    ledger, entry, batch_index = current
    return int((ledger << 40) | (entry << _SLOT_BITS) | ((batch_index + 1) & _SLOT_MASK))


@dataclass
class _Series:
    taken_at: int
    """The highest id the name held when this process took it (everything at or below it
    was handled before)."""
    highest: int
    """The highest id given since."""
    given: OrderedDict[Position, int] = field(default_factory=OrderedDict)
    """The ids given, by input position (the most recent ones)."""
    moved: int = 0
    """Outputs given the id after the highest (the first is logged, then one in
    ``_LOG_EVERY``)."""


class OutputSequence:
    """Gives each output of an input partition its sequence id."""

    def __init__(self, remembered: int) -> None:
        """``remembered``: how many ids given per partition are kept to be given again (at
        least what may be unacknowledged at once)."""
        self._remembered = remembered
        self._series: dict[str, _Series] = {}

    def opened(self, partition: str, last_sequence_id: int) -> None:
        """The output producer of ``partition`` was opened; the broker had ids up to
        ``last_sequence_id`` under its name."""
        series = self._series.get(partition)
        if series is None:
            self._series[partition] = _Series(last_sequence_id, last_sequence_id)
        elif last_sequence_id > series.highest:  # another instance had it meanwhile
            series.taken_at = series.highest = last_sequence_id

    def next_id(self, partition: str, message_id: Any) -> int:
        """The id of the output of ``message_id``, an input from ``partition`` whose output
        producer is open."""
        series = self._series[partition]
        current = position(message_id)
        given = series.given.get(current)
        if given is not None:
            return given
        own = _of_position(current)
        if own > series.highest or own <= series.taken_at:
            chosen = own
        elif (series.highest + 1) >> _SLOT_BITS == series.highest >> _SLOT_BITS:
            chosen = series.highest + 1
            series.moved += 1
            if series.moved % _LOG_EVERY == 1:  # a take-over may hand back thousands
                log.warning(
                    "message %s of %s came after later ones (a Failover take-over): its "
                    "output is sent with sequence id %d instead of %d, so the broker keeps it "
                    "(%d so far for this partition)",
                    message_id,
                    partition,
                    chosen,
                    own,
                    series.moved,
                )
        else:
            chosen = own
            log.error(
                "message %s of %s came after later ones (a Failover take-over), more of "
                "them than one entry has ids to spare (4,095): the broker's deduplication "
                "will drop its output",
                message_id,
                partition,
            )
        series.highest = max(series.highest, chosen)
        series.given[current] = chosen
        if len(series.given) > self._remembered:
            series.given.popitem(last=False)
        return chosen
