"""Where an instance's messages come from: its consumers, the retries it holds back, and
messages handed back unprocessed, in the order they must be processed."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pulsar

from magnetar.instance.config import FunctionConfig, SubscriptionType
from magnetar.instance.options import InstanceOptions
from magnetar.instance.repeats import RepeatFilter
from magnetar.instance.retries import Received, RetryQueue
from magnetar.instance.stranded import stranded_check
from magnetar.instance.subscription import open_consumers

__all__ = ["Inputs"]

log = logging.getLogger(__name__)

_WAITED_S = 0.0002
"""A receive that took longer than this waited for its message. If the message was also
published after the consumer subscribed (live, not the backlog the broker hands over on
subscribing), the queue was empty until it came, so almost always nothing is behind it. On a
light stream an empty poll, the client's exception, costs 25-60 us, ten times a message's
receive, and it sat on every message's path twice."""


class Inputs:
    """The instance's consumers and the messages it holds (see ``retries``)."""

    def __init__(
        self,
        client: pulsar.Client,
        config: FunctionConfig,
        options: InstanceOptions,
        retries: RetryQueue,
        stop: threading.Event,
    ) -> None:
        self._client = client
        self._stop = stop
        self._config = config
        self._options = options
        self.retries = retries
        self.consumers: list[Any] = []
        self._consumer_by_topic: dict[str, Any] = {}
        self._handed_back: deque[Received] = deque()
        self._alone = False
        """The last message came alone after a wait (see ``_WAITED_S``)."""
        self._subscribed_ms = 0
        """When the consumers subscribed (ms since the epoch, as publish times are)."""
        self.rewind_requested = False
        """A failed send on an ordered subscription: resubscribe before going on."""
        self._skip_before_ms = 0
        """``skipToLatest``: messages published before the instance started are skipped."""
        # what may be held at once: the unacknowledged, and the most a consumer prefetches
        prefetched = [spec.receiver_queue_size for spec in config.input_specs.values()]
        held = options.max_unacked + max([options.receiver_queue_size, *filter(None, prefetched)])
        self._repeats = (
            RepeatFilter(
                held,
                topics=len(config.input_serdes()) + len(config.input_patterns()) > 1,
            )
            if config.subscription_type is SubscriptionType.FAILOVER
            else None
        )
        self._stranded = stranded_check(config, options)

    def subscribe(self) -> None:
        if self._repeats is not None:
            self._repeats.forget()
        self._subscribed_ms = int(time.time() * 1000)
        self.consumers = open_consumers(
            self._client, self._config, self._options.instance_id, self._options
        )
        for topic in self._config.input_serdes():
            self._consumer_by_topic[topic] = self.consumers[0]
        if self._config.skip_to_latest:
            # Skipped by publish time as they arrive: brokers differ in what seek() does
            # (pulsar-lite ignores a time), and a skipped message costs no more than its ack.
            self._skip_before_ms = int(time.time() * 1000)

    def receive(
        self,
        waiting_for_sends: bool,
        busy: bool = False,
        wake_in_s: float | None = None,
        idle: Callable[[], None] | None = None,
    ) -> list[Received]:
        """Up to ``max_chunk`` messages: what was handed back, the retries that are due,
        then new messages (waiting briefly for the first when there is nothing else, no
        longer than ``wake_in_s``, and not at all when the runner is ``busy`` with work of its
        own). ``idle`` is called before waiting, once no message is ready or the last one came
        alone after a wait."""
        limit = self._options.max_chunk
        received: list[Received] = []
        alone, self._alone = self._alone, False
        while self._handed_back and len(received) < limit:
            received.append(self._handed_back.popleft())
        if len(received) < limit and len(self.retries):
            received += self.retries.due(limit - len(received))
        if received:
            return received
        poll_ms = 5 if waiting_for_sends else self._options.poll_interval_ms
        due = self.retries.next_due()
        if due is not None:
            poll_ms = min(poll_ms, int((due - time.monotonic()) * 1000) + 1)
        if wake_in_s is not None:
            poll_ms = min(poll_ms, int(wake_in_s * 1000) + 1)
        if len(self.retries) >= self._options.max_unacked:
            # held retries fill the window, so no new input: wait for the first to be due
            # (returning at once spun a core for as long as the retries waited)
            if not busy:
                self._stop.wait(max(1, poll_ms) / 1000)
            return received
        poll_ms = 0 if busy else max(1, poll_ms // len(self.consumers))
        if idle is not None:
            if not alone:  # otherwise nothing was ready a moment ago: no poll before the flush
                self._take(received, limit, 0)
            if not received and not self.rewind_requested:
                idle()
                if poll_ms:
                    self._take(received, limit, poll_ms)
        else:
            self._take(received, limit, poll_ms)
        if received and self._stranded is not None:
            self._stranded.received(received)
        if self._skip_before_ms:
            return self._skip_old(received)
        return received

    def _take(self, received: list[Received], limit: int, wait_ms: int) -> None:
        """Add what the consumers hold, waiting up to ``wait_ms`` on each for its first (a
        lone consumer's live message that ended a wait is taken alone)."""
        may_wait_alone = wait_ms > 0 and len(self.consumers) == 1
        for consumer in self.consumers:
            try:
                started = time.perf_counter()
                message = consumer.receive(wait_ms)
                self._add(received, consumer, message)
                if (
                    may_wait_alone
                    and time.perf_counter() - started > _WAITED_S
                    and message.publish_timestamp() >= self._subscribed_ms
                ):
                    self._alone = True
                    return
                while len(received) < limit:
                    self._add(received, consumer, consumer.receive(0))
            except pulsar.Timeout:
                pass
            except pulsar.AlreadyClosed:
                if self._stop.is_set():
                    break
                # the client gives up a consumer whose reconnection the broker refused (seen
                # when a restarted broker came back): subscribe again rather than fail
                log.warning("%s: the client closed a consumer; subscribing again", consumer.topic())
                self.rewind_requested = True
                break

    def _add(self, received: list[Received], consumer: Any, message: Any) -> None:
        if self._repeats is None or self._repeats.first_time(message):
            received.append((consumer, message))
        else:
            log.debug(
                "%s: %s delivered again while held; dropped",
                message.topic_name(),
                message.message_id(),
            )

    def _skip_old(self, received: list[Received]) -> list[Received]:
        kept = []
        for consumer, message in received:
            if message.publish_timestamp() < self._skip_before_ms:
                consumer.acknowledge(message)
            else:
                kept.append((consumer, message))
        return kept

    def prefetched(self, budget: int) -> list[Received]:
        """What the consumers already hold, without waiting (on a graceful stop)."""
        received: list[Received] = []
        for consumer in self.consumers:
            try:
                while len(received) < budget:
                    self._add(received, consumer, consumer.receive(0))
            except (pulsar.Timeout, pulsar.AlreadyClosed):
                pass
        return received

    def ask_for_stranded(self, holding: bool) -> None:
        """On an ordered subscription, ask the broker for what a take-over may have left
        unsent, once the instance has held nothing for a while (see ``stranded``); ``holding``:
        it holds unacknowledged messages or is processing some."""
        check = self._stranded
        if check is None:
            return
        if holding or self._handed_back or len(self.retries):
            check.holding()
            return
        left = check.left_unsent()
        if left:
            log.warning(
                "%s: %d messages came once asked for: the broker had left them unsent after "
                "a change of the subscription's active consumer",
                self._config.fqfn,
                left,
            )
        if check.due():
            log.debug("asking the broker for unacknowledged messages a take-over left unsent")
            for consumer in self.consumers:
                consumer.redeliver_unacknowledged_messages()

    def hand_back(self, received: list[Received]) -> None:
        """Messages taken but not processed: they come first, in this order, next time."""
        self._handed_back.extendleft(reversed(received))

    def redeliver(self, consumer: Any, message: Any) -> None:
        """Have the broker deliver a message again (its send failed): a negative ack, or for
        an ordered subscription a rewind, since brokers redeliver those only on reconnect."""
        if self._config.subscription_type is SubscriptionType.FAILOVER:
            self.rewind_requested = True
        else:
            consumer.negative_acknowledge(message)

    def rewind(self, pause_s: float) -> None:
        """Resubscribe, so delivery resumes at the first unacknowledged message; what is held
        here comes again from the broker."""
        for consumer in self.consumers:
            with contextlib.suppress(pulsar.AlreadyClosed):
                consumer.close()
        self.consumers.clear()
        self._handed_back.clear()
        self.retries.clear()
        self._stop.wait(pause_s)
        self.subscribe()
        self.rewind_requested = False

    def ack(self, message_id: Any, topic: str) -> None:
        """Acknowledge for the function (``context.ack``)."""
        consumer = self._consumer_by_topic.get(topic) or self.consumers[0]
        consumer.acknowledge(message_id)

    def close(self) -> None:
        for consumer in self.consumers:
            try:
                consumer.close()
            except Exception as error:
                log.debug("closing a consumer failed: %s", error)
        self.consumers.clear()
