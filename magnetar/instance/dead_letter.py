"""The dead-letter topic: where a message goes once the function has failed on it
``maxMessageRetries`` + 1 times.

The message goes as it came (payload, key, event time, properties) with the two properties
Pulsar's clients add to a dead letter: ``REAL_TOPIC`` (where it came from) and
``ORIGIN_MESSAGE_ID``. Without ``deadLetterTopic`` the topic is the clients' default,
``<input topic>-<subscription>-DLQ`` (a ``/`` of the subscription name becomes ``-``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from magnetar.instance.config import FunctionConfig
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.topics import full_topic_name

__all__ = ["DeadLetters", "origin_message_id"]

REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"


def origin_message_id(message_id: Any) -> str:
    """A message id as Pulsar's Java client prints it: ``ledger:entry:partition[:batch]``."""
    text = f"{message_id.ledger_id()}:{message_id.entry_id()}:{message_id.partition()}"
    batch_index = message_id.batch_index()
    return f"{text}:{batch_index}" if batch_index >= 0 else text


class DeadLetters:
    """Sends given-up messages to the function's dead-letter topic."""

    def __init__(
        self, config: FunctionConfig, sender: ChunkSender, producer_for: Callable[[str], Any]
    ) -> None:
        self._topic = (
            full_topic_name(config.dead_letter_topic) if config.dead_letter_topic else None
        )
        self._suffix = "-" + config.subscription_name.replace("/", "-") + "-DLQ"
        inputs = sorted(config.input_serdes()) or ["timers"]
        self._first_input = full_topic_name(inputs[0])
        self._sender = sender
        self._producer_for = producer_for

    def topic_for(self, message: Any) -> str:
        """The dead-letter topic of a message from ``message.topic_name()``."""
        return self._topic or message.topic_name() + self._suffix

    def send_timer(self, chunk: Chunk, payload: bytes, properties: dict[str, str]) -> str:
        """Send a given-up timer as part of ``chunk``: to ``deadLetterTopic``, or the
        default dead-letter topic of the function's first input; the topic."""
        topic = self._topic or self._first_input + self._suffix
        self._sender.send(chunk, self._producer_for(topic), payload, {"properties": properties})
        return topic

    def send(self, chunk: Chunk, message: Any) -> str:
        """Send ``message`` to its dead-letter topic as part of ``chunk`` (the caller puts
        the message among the chunk's inputs, so it is acknowledged once the dead letter is
        persisted, and processed again if the send fails); the topic."""
        topic = self.topic_for(message)
        properties = dict(message.properties())
        properties[REAL_TOPIC] = message.topic_name()
        properties[ORIGIN_MESSAGE_ID] = origin_message_id(message.message_id())
        kwargs: dict[str, Any] = {"properties": properties}
        key = message.partition_key()
        if key:
            kwargs["partition_key"] = key
        event_time = message.event_timestamp()
        if event_time:
            kwargs["event_timestamp"] = event_time
        self._sender.send(chunk, self._producer_for(topic), message.data(), kwargs, owner=message)
        return topic
