"""When to ask the broker again for what a Failover take-over left unsent.

When the active consumer of a Failover subscription changes, Apache Pulsar rewinds the
subscription to its first unacknowledged message after ``activeConsumerFailoverDelayTimeMillis``,
so that the new active consumer is handed what the old one had not acknowledged. If the new
one is meanwhile waiting for new messages at the end of the topic (handed the later messages
first, and done with them), the rewind does not cancel that wait (4.2.4): what the old consumer
left comes only with the next message published, on a quiet topic never. In 5 of 6 take-overs
from a consumer holding 10-20 of 50 messages, the new one was handed only the others; the rest
came with the next message, 8 s later (tests/integration/test_output_sequence.py).

A consumer's own request to redeliver what is unacknowledged cancels that wait before it
rewinds. So once an instance on an ordered subscription has received messages, then held
nothing and received nothing for a while, it asks: when nothing was left, nothing comes, and
the broker has rewound to where it was. It asks again after twice as long, and so on, while
nothing comes, since the take-over may come later (and a request that comes before the
broker's delayed rewind is ignored). The Python client does not tell a consumer that it became
the active one (it has no consumer event listener), which would say exactly when to ask.
"""

from __future__ import annotations

import time

__all__ = ["StrandedCheck"]


class StrandedCheck:
    """Says when an instance holding nothing should ask for what may have been left unsent."""

    def __init__(self, quiet_s: float) -> None:
        self._quiet_s = quiet_s
        self._wait_s = quiet_s
        self._since: float | None = None
        """When the instance last received or held a message; None before its first."""

    def received(self) -> None:
        self._since = time.monotonic()
        self._wait_s = self._quiet_s

    def holding(self) -> None:
        """The instance holds messages (unacknowledged, or being processed): its
        acknowledgements must reach the broker before it asks, or those come again."""
        if self._since is not None:
            self._since = time.monotonic()

    def due(self) -> bool:
        """Whether to ask now; if so, the next time is twice as far."""
        if self._since is None or time.monotonic() - self._since < self._wait_s:
            return False
        self._since = time.monotonic()
        self._wait_s *= 2
        return True
