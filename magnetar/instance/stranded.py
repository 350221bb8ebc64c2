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

Only an instance that acknowledges every input itself asks, and not one that holds inputs in
windows: what a function leaves unacknowledged on purpose (``MANUAL``, ``autoAck`` false), or
a window holds until it fires, would come again at every request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from magnetar.instance.config import FunctionConfig, SubscriptionType
from magnetar.instance.options import InstanceOptions

__all__ = ["StrandedCheck", "stranded_check"]

_SETTLED_S = 1.0
"""What came because the instance asked is reported once nothing has come for this long."""


class StrandedCheck:
    """Says when an instance holding nothing should ask for what may have been left unsent,
    and counts what came because it asked."""

    def __init__(self, quiet_s: float) -> None:
        self._quiet_s = quiet_s
        self._wait_s = quiet_s
        self._since: float | None = None
        """When the instance last received or held a message; None before its first."""
        self._received_ms = 0
        """When it last received messages (ms since the epoch, as publish times are)."""
        self._asked_before_ms: int | None = None
        """Messages published before this came because the instance asked for them."""
        self._left = 0
        """How many came so, not yet reported."""

    def received(self, messages: Sequence[tuple[Any, Any]]) -> None:
        """The instance took ``messages`` (consumer, message pairs). Right after it asked,
        those published before the last it took before asking are counted: the broker had
        left them unsent while the instance waited (publish times, as the producers' clocks
        say)."""
        self._since = time.monotonic()
        self._wait_s = self._quiet_s
        asked_before, self._asked_before_ms = self._asked_before_ms, None
        self._received_ms = int(time.time() * 1000)
        if asked_before is None:
            return
        left = sum(1 for _, message in messages if message.publish_timestamp() < asked_before)
        if left:  # more may follow in the next messages taken
            self._left += left
            self._asked_before_ms = asked_before

    def left_unsent(self) -> int:
        """How many came because the instance asked, once nothing has come for a moment;
        each is reported once."""
        if not self._left or self._since is None or time.monotonic() - self._since < _SETTLED_S:
            return 0
        left, self._left = self._left, 0
        return left

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
        self._asked_before_ms = self._received_ms
        return True


def stranded_check(config: FunctionConfig, options: InstanceOptions) -> StrandedCheck | None:
    """The check for an instance of ``config``, if it is one that asks (see the module doc)."""
    if (
        options.stranded_check_s is None
        or config.subscription_type is not SubscriptionType.FAILOVER
        or not config.acks_automatically
        or config.window_config is not None
    ):
        return None
    return StrandedCheck(options.stranded_check_s)
